"""One compiled decode chunk with model.init's stacked weights against the engines' decode
layout (model.unstack_layers: per-layer arrays, per-expert ones or a layer's experts fused,
and the projection kernels as cpu_decode.projection_layout stores them for the batch when
the weights stream from memory), in one process, interleaved, best (or --stat median) of
--rounds: the in-process ratios behind
docs/benchmarks.md "Decoding" (its decode layout row) and "Decode against the JAX peers".
Greedy, --steps steps a chunk (decode_loop.decode_steps), 16-token positions into a cache
of 88 slots; checks that every layout samples the same tokens.

    python -m tools.bench.decode_layout --variant small --batches 1,8,32
    python -m tools.bench.decode_layout --variant qwen3_small \
        --layouts layers+experts,+projections --steps 64
    python -m tools.bench.decode_layout --variant qwen3_moe_tiny \
        --layouts layers+experts,layers+fused --steps 64 --rounds 21 --stat median

--variant: a c2jax variant (c2jax/model/variants.py) or a model of decode_peers.py
(e.g. qwen3_moe_tiny: qwen3_tiny with 8 experts a layer).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2jax import host_memory, model
from c2jax.model import variants
from c2jax.rollout import cpu_decode, decode_loop

LAYOUTS = ("stacked", "layers", "layers+experts", "layers+fused", "+projections")
STATS = {"best": min, "median": statistics.median}


def _inputs(batch: int):
  return (jnp.arange(batch, dtype=jnp.int32) + 5, jnp.full((batch,), 16, jnp.int32),
          jnp.ones((batch,), bool), jnp.zeros((batch,), bool),
          jnp.zeros((batch,), jnp.float32), jnp.zeros((batch,), jnp.int32),
          jnp.ones((batch,), jnp.float32), jnp.arange(batch, dtype=jnp.uint32),
          jnp.full((batch, 1), -1, jnp.int32), jnp.full((batch,), 1000, jnp.int32))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--variant", default="small")
  parser.add_argument("--batches", default="1,8,32")
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--steps", type=int, default=8, help="decode steps a chunk")
  parser.add_argument("--stat", choices=sorted(STATS), default="best",
                      help="each layout's time: the best or the median of its rounds")
  parser.add_argument("--layouts", default=",".join(LAYOUTS),
                      help=f"comma-separated, of {LAYOUTS}; the first is the baseline. "
                      "layers+fused: experts fused (unstack_layers fuse_experts=True); "
                      "+projections: layers+experts with cpu_decode's projection kernels "
                      "(the same as layers+experts where the weights fit in the cache)")
  args = parser.parse_args(argv)
  names = args.layouts.split(",")
  if not names or any(name not in LAYOUTS for name in names):
    raise SystemExit(f"--layouts: choose from {LAYOUTS}; got {args.layouts!r}.")
  host_memory.retain_freed_memory()
  from tools.bench.decode_peers import MODELS  # the peer bench's model names
  variant, overrides = MODELS.get(args.variant, (args.variant, {}))
  cfg = variants.get(variant, **overrides)
  params = model.init(cfg, jax.random.key(0))
  chunk = jax.jit(functools.partial(decode_loop.decode_steps, cfg, args.steps),
                  donate_argnums=(1,))

  for batch in (int(b) for b in args.batches.split(",")):
    inputs = _inputs(batch)
    make = {"stacked": lambda: params,
            "layers": lambda: model.unstack_layers(params),
            "layers+experts": lambda: model.unstack_layers(params, split_experts=True),
            "layers+fused": lambda: model.unstack_layers(params, fuse_experts=True),
            "+projections": lambda: cpu_decode.relayout(
                model.unstack_layers(params, split_experts=True), projections)}
    timings = cpu_decode.ProductTimings.from_env()
    projections = ("+projections" in names
                   and cpu_decode.projection_layout(cfg, params, batch, timings=timings))
    if "+projections" in names and not projections:
      print(f"batch {batch}: weights fit in the last-level cache: kernels as stored")
    elif projections:
      for (ins, outs), form in projections.chosen.items():
        [seconds] = [v for k, v in timings.table().items()
                     if k.startswith(f"{batch}x{ins}x{outs}:")]
        print(f"batch {batch}: [{batch}, {ins}] x [{ins}, {outs}] us per product: "
              + ", ".join(f"{f} {t * 1e6:.1f}" for f, t in sorted(seconds.items()))
              + f" -> {form}", flush=True)
    layouts = {name: make[name]() for name in names}
    base = names[0]

    def run(p, inputs=inputs, batch=batch):
      cache = jax.tree.map(lambda a: a + 0.01, model.init_cache(cfg, batch, 88))
      jax.block_until_ready(cache)
      start = time.perf_counter()
      out = jax.block_until_ready(chunk(p, cache, *inputs))
      return time.perf_counter() - start, out

    first = {name: run(p)[1] for name, p in layouts.items()}  # compile
    for name in layouts:
      same = np.array_equal(first[name][1], first[base][1])
      assert same, f"{name}: sampled tokens differ from the {base} layout's"
    times = {name: [] for name in layouts}
    for _ in range(args.rounds):
      for name, p in layouts.items():
        times[name].append(run(p)[0])
    best = {name: STATS[args.stat](t) for name, t in times.items()}
    print(f"{args.variant} batch {batch}: " + "  ".join(
        f"{name} {best[name] * 1e3 / args.steps:.2f} ms/step ({best[base] / best[name]:.2f}x)"
        for name in layouts), flush=True)


if __name__ == "__main__":
  main()
