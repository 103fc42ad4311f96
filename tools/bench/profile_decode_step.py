"""Where a decode step's time goes, per model and batch: each part compiled and timed
alone, interleaved round by round, best of --rounds (ms per decode step):

  layers     the decoder layers and final norm over a one-token step against the KV
             cache (in the per-layer layout JaxEngine picks on one CPU device, with the
             projection kernels as model.init stores them: the engine may also transpose
             or split some, c2jax/rollout/cpu_decode), no LM head
  head       the LM head over the step's hidden state
  sampler    greedy sampling and the token's log-prob (c2jax.rollout.sampling.sample)
  loop       one compiled 64-step decode loop (decode_loop.decode_steps), per step: the
             three above plus the loop's own work (stop checks, output buffers)
  engine@8   JaxEngine.generate's decode, per step, with 8-token decode calls
  engine@64  the same with 64-token calls (the default when no request has stop strings)
engine@N - loop is the host's per-call work (scheduling, reading tokens, log-probs and
routing back) spread over the call's N steps.

    python -m tools.bench.profile_decode_step --variants qwen3_small --batches 1,8,32
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2jax import host_memory, model
from c2jax.model import variants
from c2jax.rollout import JaxEngine, Request, SamplingParams, decode_loop, sampling
from c2jax.rollout.cpu_decode import decode_layout_pays

PROMPT, STEPS = 16, 64


def _best(fn, rounds):
  fn()
  return min(_timed(fn) for _ in range(rounds))


def _timed(fn):
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def profile(cfg, params, batch: int, rounds: int) -> dict:
  layout = (model.unstack_layers(params, split_experts=True)
            if decode_layout_pays(cfg, batch) else params)
  length = PROMPT + STEPS + 8
  cache = model.init_cache(cfg, batch, length)
  tokens = jnp.arange(batch, dtype=jnp.int32)[:, None] + 3
  positions = jnp.full((batch, 1), PROMPT, jnp.int32)
  layers = jax.jit(lambda p, c: model.apply(cfg, p, tokens, positions_BxL=positions,
                                            cache=c, head=False)[0])
  hidden = layers(layout, cache)
  head = jax.jit(lambda p, h: jnp.einsum("bld,dv->blv", h, p["lm_head"]["kernel"],
                                         preferred_element_type=jnp.float32))
  logits = head(layout, hidden)[:, 0]
  zeros_f, zeros_i = jnp.zeros((batch,), jnp.float32), jnp.zeros((batch,), jnp.int32)
  keys = sampling.row_keys(jnp.arange(batch, dtype=jnp.uint32), zeros_i)
  sample = jax.jit(lambda x: sampling.sample(x, zeros_f, zeros_i, zeros_f + 1, keys))
  loop = jax.jit(functools.partial(decode_loop.decode_steps, cfg, STEPS))
  loop_inputs = (tokens[:, 0], jnp.full((batch,), PROMPT, jnp.int32),
                 jnp.ones((batch,), bool), jnp.zeros((batch,), bool), zeros_f, zeros_i,
                 zeros_f + 1, jnp.arange(batch, dtype=jnp.uint32),
                 jnp.full((batch, 1), -1, jnp.int32), jnp.full((batch,), 10_000, jnp.int32))
  prompts = np.random.default_rng(0).integers(1, cfg.vocab_size, (batch, PROMPT))
  engines = {n: JaxEngine(cfg, params, num_slots=batch, max_length=length,
                          prefill_buckets=(PROMPT,), max_decode_steps=n) for n in (8, 64)}

  def generate(engine, count):
    return engine.generate([Request(p, SamplingParams(temperature=0.0, max_tokens=count))
                            for p in prompts])[0].tokens

  parts = {
      "layers": (lambda: layers(layout, cache), 1),
      "head": (lambda: head(layout, hidden), 1),
      "sampler": (lambda: sample(logits), 1),
      "loop": (lambda: loop(layout, cache, *loop_inputs)[1], STEPS),
  }
  for n, engine in engines.items():
    parts[f"engine@{n}"] = (functools.partial(generate, engine, STEPS), STEPS - 1)
    parts[f"engine@{n} one"] = (functools.partial(generate, engine, 1), 1)
  best = {name: float("inf") for name in parts}
  for name, (fn, _) in parts.items():
    fn()  # compile
  for _ in range(rounds):
    for name, (fn, _) in parts.items():
      best[name] = min(best[name], _timed(fn))
  out = {name: best[name] / per * 1e3 for name, (_, per) in parts.items()
         if not name.endswith(" one")}
  for n in engines:  # decode only: a one-token generate's time (the prefill) off
    out[f"engine@{n}"] = (best[f"engine@{n}"] - best[f"engine@{n} one"]) / (STEPS - 1) * 1e3
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--variants", default="qwen3_small")
  parser.add_argument("--batches", default="1,8,32")
  parser.add_argument("--rounds", type=int, default=5)
  args = parser.parse_args(argv)
  host_memory.retain_freed_memory()
  print(f"decode step profile, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; ms per step")
  names = ("layers", "head", "sampler", "loop", "engine@8", "engine@64")
  print("| model | batch | " + " | ".join(names) + " |")
  print("|" + "---|" * (len(names) + 2))
  for variant in args.variants.split(","):
    cfg = variants.get(variant)
    params = jax.jit(lambda k, c=cfg: model.init(c, k))(jax.random.key(0))
    for batch in map(int, args.batches.split(",")):
      row = profile(cfg, params, batch, args.rounds)
      print(f"| {variant} | {batch} | " + " | ".join(f"{row[n]:.3f}" for n in names) + " |",
            flush=True)


if __name__ == "__main__":
  main()
