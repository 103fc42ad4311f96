"""Benchmark: grouped matmul impls vs lax.ragged_dot vs one dense matmul of equal FLOPs.

Prints one table: TFLOP/s and fraction of the measured dense bf16 ceiling, forward and
forward+backward, at Kimi-K2.5-like expert shapes (hidden 7168, expert width 2048, 48 local
experts = 384 / EP 8, 32768 routed rows). `--small` runs tiny shapes on CPU in seconds.

  PYTHONPATH=. python tools/bench/bench_grouped_matmul.py [--small]
"""

import argparse
import datetime
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import c2jax_kernels as kernels

FULL = dict(rows=32768, hidden=7168, width=2048, experts=48)
SMALL = dict(rows=512, hidden=256, width=128, experts=8)


def time_fn(fn, *args, repeats):
  """Median wall seconds of a jitted call (compile and one warm-up excluded)."""
  jax.block_until_ready(fn(*args))
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    samples.append(time.perf_counter() - start)
  return statistics.median(samples)


def print_table(title, rows, ceiling_tflops):
  print(f"\n{title}\n{'case':<48}{'ms':>10}{'TFLOP/s':>10}{'of dense':>10}")
  for name, seconds, flops in rows:
    tflops = flops / seconds / 1e12
    print(f"{name:<48}{seconds * 1e3:>10.3f}{tflops:>10.3f}{tflops / ceiling_tflops:>10.1%}")


def balanced_group_sizes(rows, experts, seed=0):
  """Roughly balanced routing with jitter, as after aux-loss-free balancing."""
  weights = np.random.default_rng(seed).uniform(0.5, 1.5, experts)
  sizes = np.floor(weights / weights.sum() * rows).astype(np.int32)
  sizes[0] += rows - sizes.sum()
  return jnp.asarray(sizes)


def impls_for_backend():
  """Pallas kernels only where they compile natively; interpret mode is not a benchmark."""
  native = {'gpu': 'mosaic_gpu', 'tpu': 'megablox'}.get(jax.default_backend())
  return ([native] if native else []) + ['ragged_dot']


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--small', action='store_true', help='tiny shapes for a CPU run')
  parser.add_argument('--repeats', type=int, default=None)
  args = parser.parse_args()
  shape = SMALL if args.small else FULL
  repeats = args.repeats or (5 if args.small else 20)
  m, k, n, g = shape['rows'], shape['hidden'], shape['width'], shape['experts']
  keys = jax.random.split(jax.random.key(0), 3)
  lhs = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
  rhs = (jax.random.normal(keys[1], (g, k, n)) / np.sqrt(k)).astype(jnp.bfloat16)
  dense_rhs = rhs[0]
  dout = jax.random.normal(keys[2], (m, n), jnp.bfloat16)
  sizes = balanced_group_sizes(m, g)
  flops = 2 * m * k * n

  dense = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32)
                  .astype(jnp.bfloat16))
  dense_train = jax.jit(lambda a, b, d: jax.vjp(dense, a, b)[1](d))
  dense_s = time_fn(dense, lhs, dense_rhs, repeats=repeats)
  ceiling = flops / dense_s / 1e12
  rows = [('dense bf16 matmul fwd', dense_s, flops),
          ('dense bf16 matmul bwd (2 GEMMs)', time_fn(dense_train, lhs, dense_rhs, dout,
                                                      repeats=repeats), 2 * flops)]
  for impl in impls_for_backend():
    fwd = jax.jit(lambda a, b, s, impl=impl: kernels.grouped_matmul(a, b, s, impl=impl))
    bwd = jax.jit(lambda a, b, s, d, impl=impl: jax.vjp(
        lambda x, w: kernels.grouped_matmul(x, w, s, impl=impl), a, b)[1](d))
    rows.append((f'grouped {impl} fwd', time_fn(fwd, lhs, rhs, sizes, repeats=repeats),
                 flops))
    rows.append((f'grouped {impl} bwd (2 GEMMs)',
                 time_fn(bwd, lhs, rhs, sizes, dout, repeats=repeats), 2 * flops))
  device = jax.devices()[0]
  print(f"grouped matmul, {datetime.date.today()}, {device.platform} {device.device_kind}, "
        f"M={m} K={k} N={n} G={g}, bf16 in, f32 accumulate, median of {repeats}")
  print_table('(fraction of the dense bf16 forward rate)', rows, ceiling)


if __name__ == '__main__':
  main()
