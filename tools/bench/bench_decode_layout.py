"""One compiled decode chunk with model.init's stacked weights against the engines' decode
layout (model.unstack_layers: per-layer arrays, per-expert ones with --split), in one
process, interleaved, best of --rounds: the in-process ratio behind docs/benchmarks.md
"Decoding" (its decode layout row). Greedy, 8 steps a chunk (decode_loop.decode_steps),
16-token positions into a cache of 88 slots; checks that both layouts sample the same tokens.

    PYTHONPATH=. python tools/bench/bench_decode_layout.py --variant small --batches 1,8,32
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2jax import host_memory, model
from c2jax.model import variants
from c2jax.rollout import decode_loop

STEPS = 8


def _inputs(batch: int):
  return (jnp.arange(batch, dtype=jnp.int32) + 5, jnp.full((batch,), 16, jnp.int32),
          jnp.ones((batch,), bool), jnp.zeros((batch,), bool),
          jnp.zeros((batch,), jnp.float32), jnp.zeros((batch,), jnp.int32),
          jnp.ones((batch,), jnp.float32), jnp.arange(batch, dtype=jnp.uint32),
          jnp.full((batch, 1), -1, jnp.int32), jnp.full((batch,), 1000, jnp.int32))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--variant", default="small")
  parser.add_argument("--batches", default="1,8,32")
  parser.add_argument("--rounds", type=int, default=7)
  args = parser.parse_args()
  host_memory.retain_freed_memory()
  cfg = variants.get(args.variant)
  params = model.init(cfg, jax.random.key(0))
  layouts = {"stacked": params,
             "layers": model.unstack_layers(params),
             "layers+experts": model.unstack_layers(params, split_experts=True)}
  chunk = jax.jit(functools.partial(decode_loop.decode_steps, cfg, STEPS), donate_argnums=(1,))

  for batch in (int(b) for b in args.batches.split(",")):
    inputs = _inputs(batch)

    def run(p, inputs=inputs, batch=batch):
      cache = jax.tree.map(lambda a: a + 0.01, model.init_cache(cfg, batch, 88))
      jax.block_until_ready(cache)
      start = time.perf_counter()
      out = jax.block_until_ready(chunk(p, cache, *inputs))
      return time.perf_counter() - start, out

    first = {name: run(p)[1] for name, p in layouts.items()}  # compile
    for name in layouts:
      same = np.array_equal(first[name][1], first["stacked"][1])
      assert same, f"{name}: sampled tokens differ from the stacked layout's"
    best = dict.fromkeys(layouts, float("inf"))
    for _ in range(args.rounds):
      for name, p in layouts.items():
        best[name] = min(best[name], run(p)[0])
    print(f"{args.variant} batch {batch}: " + "  ".join(
        f"{name} {best[name] * 1e3 / STEPS:.2f} ms/step ({best['stacked'] / best[name]:.2f}x)"
        for name in layouts), flush=True)


if __name__ == "__main__":
  main()
