"""What XLA:CPU gives the shapes of `small`'s decode step and train step: the measurements
behind docs/benchmarks.md's "What limits `small` on XLA:CPU" (issue 20, items 1 and 2).
Three tables, each row against a baseline measured in the same run:

  rows      one [M, D] x [D, F] dot per expert weight, 112 distinct weights in a chain
            (7 MoE layers x 16 experts: too many to stay in cache, as in a decode step),
            and the [M, D] x [D, V] LM head, for M = 1 ... 64 rows: time per dot, the
            weight bytes it streams per second and its FLOP rate, vs the 2048^3 ceiling.
  skips     the same 112 weights at M rows run one after another (a chain), independently
            (summed at the end), each behind a `lax.cond` as the decode dispatch skips
            unchosen experts (chained and independent), and as one concatenated dot: what
            the runtime overlaps and what a cond costs.
  grouped   the train step's grouped matmuls at small's shapes (token copies M = 4096,
            D = 512, F = 256, 16 experts, multinomial group sizes): the CPU tile loop of
            kernels/grouped_matmul/tiled.py (gmm, and tgmm for the weight gradient) and
            lax.ragged_dot, vs one dense dot of the same useful FLOPs.

    python -m tools.bench.cpu_limits
    python -m tools.bench.cpu_limits --smoke   # seconds (the suite)
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2jax import host_memory
from c2jax.plan import accelerators
from c2jax_kernels.grouped_matmul import tiled

FULL = dict(hidden=512, expert_width=256, vocab=16384, experts=16, weights=112,
            copies=4096, rows="1,2,4,8,16,32,64", skip_rows="1,8", repeats=5)
SMOKE = dict(hidden=64, expert_width=32, vocab=512, experts=4, weights=8, copies=64,
             rows="1,8", skip_rows="1", repeats=1)


def best_seconds(fn, *args, repeats: int, inner: int = 3) -> float:
  """Best over `repeats` of the mean of `inner` back-to-back calls (compiled first)."""
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(inner):
      out = fn(*args)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - start) / inner)
  return best


def _chain(x, weights):
  """Each dot's input depends on the last one's output (one column of it)."""
  for w in weights:
    x = x + 0.1 * (x @ w)[:, :1]
  return x


def _independent(x, weights):
  return sum(x @ w for w in weights)


def _chain_of_conds(x, weights, flags):
  y = jnp.zeros((x.shape[0], weights[0].shape[1]), x.dtype)
  for i, w in enumerate(weights):
    y = jax.lax.cond(flags[i], lambda y, w=w: y + x @ w, lambda y: y, y)
  return y


def _independent_conds(x, weights, flags):
  zeros = jnp.zeros((x.shape[0], weights[0].shape[1]), x.dtype)
  return sum(jax.lax.cond(flags[i], lambda w=w: x @ w, lambda: zeros)
             for i, w in enumerate(weights))


def rows_table(args, rng, ceiling):
  d, f, v = args.hidden, args.expert_width, args.vocab
  weights = [jnp.asarray(rng.standard_normal((d, f), np.float32)) for _ in range(args.weights)]
  head = jnp.asarray(rng.standard_normal((d, v), np.float32))
  chain, matmul = jax.jit(_chain), jax.jit(lambda x, w: x @ w)
  print(f"\nrows: {args.weights} chained [M, {d}] x [{d}, {f}] expert dots; the "
        f"[M, {d}] x [{d}, {v}] LM head\n")
  print(f"{'M':>4} {'us/dot':>8} {'GB/s':>6} {'GFLOP/s':>8} {'of ceiling':>10} | "
        f"{'head ms':>8} {'GFLOP/s':>8} {'of ceiling':>10}")
  for m in (int(r) for r in args.rows.split(",")):
    x = jnp.asarray(rng.standard_normal((m, d), np.float32))
    per_dot = best_seconds(chain, x, weights, repeats=args.repeats) / len(weights)
    dot_rate = 2 * m * d * f / per_dot
    head_s = best_seconds(matmul, x, head, repeats=args.repeats)
    head_rate = 2 * m * d * v / head_s
    print(f"{m:>4} {per_dot * 1e6:>8.1f} {d * f * 4 / per_dot / 1e9:>6.1f} "
          f"{dot_rate / 1e9:>8.1f} {dot_rate / ceiling:>10.1%} | {head_s * 1e3:>8.3f} "
          f"{head_rate / 1e9:>8.1f} {head_rate / ceiling:>10.1%}", flush=True)
  return weights


def skips_table(args, rng, weights):
  d, f = args.hidden, args.expert_width
  flags = jnp.ones((len(weights),), bool)
  concatenated = jnp.concatenate(weights, axis=1)
  cases = {"chain of dots (baseline)": (jax.jit(_chain), (weights,)),
           "independent dots": (jax.jit(_independent), (weights,)),
           "chain of conds": (jax.jit(_chain_of_conds), (weights, flags)),
           "independent conds": (jax.jit(_independent_conds), (weights, flags)),
           "one concatenated dot": (jax.jit(lambda x, w: x @ w), (concatenated,))}
  print(f"\nskips: {len(weights)} [{d}, {f}] weights, every cond taken\n")
  print(f"{'case':<26} {'M':>3} {'us/dot':>8} {'GB/s':>6} {'vs chain':>8}")
  for m in (int(r) for r in args.skip_rows.split(",")):
    x = jnp.asarray(rng.standard_normal((m, d), np.float32))
    base = None
    for name, (fn, extra) in cases.items():
      per_dot = best_seconds(fn, x, *extra, repeats=args.repeats) / len(weights)
      base = base or per_dot
      print(f"{name:<26} {m:>3} {per_dot * 1e6:>8.1f} {d * f * 4 / per_dot / 1e9:>6.1f} "
            f"{base / per_dot:>7.2f}x", flush=True)


def grouped_table(args, rng):
  m, d, f, e = args.copies, args.hidden, args.expert_width, args.experts
  sizes = jnp.asarray(rng.multinomial(m, np.ones(e) / e), jnp.int32)
  x = jnp.asarray(rng.standard_normal((m, d), np.float32))
  grad = jnp.asarray(rng.standard_normal((m, f), np.float32))
  w = jnp.asarray(rng.standard_normal((e, d, f), np.float32))
  gmm = jax.jit(lambda x, w, s: tiled.gmm(x, w, s, transpose_rhs=False,
                                          out_dtype=jnp.float32))
  cases = {
      "one dense dot (baseline)": (jax.jit(lambda x, w: x @ w[0]), (x, w)),
      "tiled gmm (x W_e)": (gmm, (x, w, sizes)),
      "tiled tgmm (x_e^T dy_e)": (
          jax.jit(lambda x, g, s: tiled.tgmm(x, g, s, out_dtype=jnp.float32)),
          (x, grad, sizes)),
      "lax.ragged_dot": (jax.jit(jax.lax.ragged_dot), (x, w, sizes))}
  reference = np.asarray(gmm(x, w, sizes))
  ragged = np.asarray(jax.jit(jax.lax.ragged_dot)(x, w, sizes))
  agree = np.abs(ragged - reference).max() / np.abs(reference).max()
  print(f"\ngrouped: M = {m} copies, [{d}] -> [{f}], {e} experts (sizes "
        f"{int(sizes.min())}-{int(sizes.max())}); ragged_dot vs gmm max rel diff {agree:.1e}\n")
  print(f"{'case':<26} {'ms':>8} {'vs dense':>9}")
  base = None
  for name, (fn, fn_args) in cases.items():
    seconds = best_seconds(fn, *fn_args, repeats=args.repeats, inner=1)
    base = base or seconds
    print(f"{name:<26} {seconds * 1e3:>8.2f} {base / seconds:>8.2f}x", flush=True)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--smoke", action="store_true", help="tiny shapes, one repeat")
  for key, value in FULL.items():
    parser.add_argument(f"--{key}", type=type(value), default=value)
  args = parser.parse_args(argv)
  if args.smoke:
    for key, value in SMOKE.items():
      setattr(args, key, value)
  host_memory.retain_freed_memory()
  device = jax.devices()[0]
  ceiling = accelerators.matmul_ceiling(jnp.float32, n=256 if args.smoke else 2048)
  print(f"XLA:CPU limits, {datetime.date.today()}, {device.platform} "
        f"({device.device_kind}), jax {jax.__version__}, load average "
        f"{os.getloadavg()[0]:.2f}; float32 matmul ceiling {ceiling / 1e9:.1f} GFLOP/s")
  rng = np.random.default_rng(0)
  weights = rows_table(args, rng, ceiling)
  skips_table(args, rng, weights)
  grouped_table(args, rng)


if __name__ == "__main__":
  main()
