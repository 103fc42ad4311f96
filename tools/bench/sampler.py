"""The greedy sampler's per-step cost on this machine: an argmax of each row of [B, V]
logits, alone and with the token's exact log-prob (what JaxEngine's decode step takes for
a greedy batch, c2jax.rollout.sampling.sample), by three argmax forms:

  blocks     sampling.argmax: one pass of block maxima, then the first block holding the
             row's maximum and the first entry of that block (what the engine runs)
  two_pass   the row's maximum, then the least index holding it, each over the whole row
             (the engine's form until 2026-12-02)
  variadic   jnp.argmax: one (value, index) reduce, which XLA:CPU runs unvectorised

Each form runs 64 times inside one compiled loop (the logits shifted per iteration, so
nothing is hoisted), interleaved round by round, best of --rounds; microseconds a step.
With --decode_variant, the same forms inside the engine's whole greedy decode loop instead
(decode_loop.decode_steps, 64 steps, the per-layer decode layout, a cache of 88 slots;
milliseconds a step): sampling.argmax is swapped while each program is traced.

    python -m tools.bench.sampler --batches 1,8,32 --vocabs 8192,16384
    python -m tools.bench.sampler --decode_variant qwen3_tiny --batches 8,32
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.rollout import sampling

STEPS = 64


def two_pass_argmax(x_BxV):
  return sampling._first_index_of(x_BxV, jnp.max(x_BxV, axis=-1, keepdims=True))


FORMS = {"blocks": sampling.argmax, "two_pass": two_pass_argmax,
         "variadic": lambda x: jnp.argmax(x, axis=-1).astype(jnp.int32)}


def _loop(argmax, logprobs: bool, x_BxV):
  def body(i, total):
    shifted_BxV = x_BxV + i.astype(jnp.float32)
    tokens_B = argmax(shifted_BxV)
    total = total + tokens_B.sum().astype(jnp.float32)
    if logprobs:
      total = total + sampling.token_logprobs(shifted_BxV, tokens_B).sum()
    return total
  return jax.lax.fori_loop(0, STEPS, body, jnp.float32(0))


def _decode_loop(variant: str, batches: list[int], rounds: int) -> None:
  from c2jax import host_memory, model
  from c2jax.model import variants
  from c2jax.rollout import decode_loop
  from tools.bench.decode_layout import _inputs
  host_memory.retain_freed_memory()
  cfg = variants.get(variant)
  params = model.unstack_layers(model.init(cfg, jax.random.key(0)), split_experts=True)
  engine_form = sampling.argmax
  print(f"| {variant} batch | " + " | ".join(f"{form} ms/step" for form in FORMS) + " |")
  print("|" + "---|" * (len(FORMS) + 1))
  for batch in batches:
    inputs = _inputs(batch)
    runs, tokens = {}, {}
    try:
      for form, argmax in FORMS.items():
        sampling.argmax = argmax  # read when decode_steps is traced, just below
        runs[form] = jax.jit(functools.partial(decode_loop.decode_steps, cfg, STEPS),
                             donate_argnums=(1,))
        tokens[form] = np.asarray(runs[form](params, model.init_cache(cfg, batch, 88),
                                             *inputs)[1])
    finally:
      sampling.argmax = engine_form
    assert all(np.array_equal(t, tokens["blocks"]) for t in tokens.values())
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(rounds):
      for form, run in runs.items():
        cache = jax.block_until_ready(model.init_cache(cfg, batch, 88))
        start = time.perf_counter()
        jax.block_until_ready(run(params, cache, *inputs))
        best[form] = min(best[form], time.perf_counter() - start)
    print(f"| {batch} | " + " | ".join(f"{best[f] / STEPS * 1e3:.3f}" for f in FORMS) + " |",
          flush=True)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batches", default="1,8,32")
  parser.add_argument("--vocabs", default="8192,16384")
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--decode_variant", default="",
                      help="time the forms in this model variant's decode loop instead")
  args = parser.parse_args(argv)
  batches = [int(b) for b in args.batches.split(",")]
  print(f"greedy sampler, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
        f"{jax.devices()[0].platform}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}; best of {args.rounds}")
  if args.decode_variant:
    _decode_loop(args.decode_variant, batches, args.rounds)
    return
  names = [f"{form}{suffix}" for suffix in ("", "+logprob") for form in FORMS]
  print("| B | V | " + " | ".join(f"{name} us/step" for name in names) + " |")
  print("|" + "---|" * (len(names) + 2))
  for vocab in map(int, args.vocabs.split(",")):
    for batch in batches:
      x_BxV = jax.random.normal(jax.random.key(batch), (batch, vocab))
      runs = {f"{form}{'+logprob' if lp else ''}":
              jax.jit(functools.partial(_loop, FORMS[form], lp))
              for lp in (False, True) for form in FORMS}
      tokens = {form: np.asarray(jax.jit(FORMS[form])(x_BxV)) for form in FORMS}
      assert all(np.array_equal(t, tokens["variadic"]) for t in tokens.values())
      for run in runs.values():
        run(x_BxV).block_until_ready()  # compile
      best = dict.fromkeys(runs, float("inf"))
      for _ in range(args.rounds):
        for name, run in runs.items():
          start = time.perf_counter()
          run(x_BxV).block_until_ready()
          best[name] = min(best[name], time.perf_counter() - start)
      print(f"| {batch} | {vocab} | "
            + " | ".join(f"{best[name] / STEPS * 1e6:.1f}" for name in names) + " |",
            flush=True)


if __name__ == "__main__":
  main()
