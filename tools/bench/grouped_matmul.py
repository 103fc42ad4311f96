"""Benchmark: grouped matmul impls vs lax.ragged_dot vs one dense matmul of equal FLOPs.

Prints one table per routing skew: ms, TFLOP/s, the fraction of the measured dense bf16
forward rate and the speed relative to `lax.ragged_dot`, forward and forward+backward, at
Kimi-K2.5 expert shapes (hidden K=7168, expert width N=2048, 48 local experts = 384 / EP 8,
32768 routed rows). Routing: 'balanced' (jitter around M/G, as after aux-loss-free
balancing) and 'skewed' (Zipf-like loads with a few empty experts, as early in training or
under a bad router). Impls: c2jax's own Pallas kernel for the backend, tokamax's (the
OpenXLA kernel library, where installed) and lax.ragged_dot; each impl's forward is checked
against lax.ragged_dot. `--small`
runs CPU-sized shapes; `--smoke` tiny ones with one repeat (the suite runs it).

  python -m tools.bench.grouped_matmul [--small | --smoke]
      [--groups balanced,skewed] [--repeats N]
"""

import argparse
import datetime
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import c2jax_kernels as kernels
from c2jax_kernels import platform

FULL = dict(rows=32768, hidden=7168, width=2048, experts=48)
SMALL = dict(rows=512, hidden=256, width=128, experts=8)
SMOKE = dict(rows=64, hidden=32, width=16, experts=6)


def time_fn(fn, *args, repeats):
  """Median wall seconds of a jitted call (compile and one warm-up excluded)."""
  jax.block_until_ready(fn(*args))
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    samples.append(time.perf_counter() - start)
  return statistics.median(samples)


def print_table(title, rows, ceiling_tflops, baseline=None, ceiling_name='dense'):
  """rows: (name, seconds, flops[, baseline seconds]); the column 'of <ceiling_name>' is
  the rate over `ceiling_tflops`, 'vs <baseline>' the baseline's time / own time (> 1:
  faster than the baseline) where a row carries one."""
  print(f"\n{title}\n{'case':<48}{'ms':>10}{'TFLOP/s':>10}{'of ' + ceiling_name:>16}"
        + (f"{'vs ' + baseline:>18}" if baseline else ''))
  for name, seconds, flops, *base in rows:
    tflops = flops / seconds / 1e12
    ratio = f"{base[0] / seconds:>17.2f}x" if base else ''
    print(f"{name:<48}{seconds * 1e3:>10.3f}{tflops:>10.3f}{tflops / ceiling_tflops:>16.1%}"
          + ratio)


def balanced_group_sizes(rows, experts, seed=0):
  """Roughly balanced routing with jitter, as after aux-loss-free balancing."""
  weights = np.random.default_rng(seed).uniform(0.5, 1.5, experts)
  sizes = np.floor(weights / weights.sum() * rows).astype(np.int32)
  sizes[0] += rows - sizes.sum()
  return jnp.asarray(sizes)


def skewed_group_sizes(rows, experts, seed=0, exponent=1.2, empty_fraction=0.125):
  """Zipf-like loads (expert r gets ~ 1 / r^exponent, shuffled) with the last
  `empty_fraction` of experts (at least one) receiving no rows at all."""
  rng = np.random.default_rng(seed)
  empty = max(1, int(experts * empty_fraction))
  weights = 1.0 / np.arange(1, experts - empty + 1) ** exponent
  sizes = np.floor(weights / weights.sum() * rows).astype(np.int32)
  sizes[0] += rows - sizes.sum()
  sizes = np.concatenate([rng.permutation(sizes), np.zeros(empty, np.int32)])
  return jnp.asarray(rng.permutation(sizes))


GROUPINGS = {'balanced': balanced_group_sizes, 'skewed': skewed_group_sizes}


def impls_for_backend():
  """c2jax's Pallas kernel where it compiles natively (interpret mode is not a benchmark),
  tokamax's kernel for this platform where the package is installed, and ragged_dot."""
  native = {'gpu': 'mosaic_gpu', 'tpu': 'megablox'}.get(jax.default_backend())
  library = ['tokamax'] if platform.library_installed() else []
  return ([native] if native else []) + library + ['ragged_dot']


def ragged_dot(a, b, sizes):
  return jax.lax.ragged_dot(a, b, sizes, preferred_element_type=jnp.float32).astype(a.dtype)


def vjp_of(fn):
  return jax.jit(lambda a, b, s, d: jax.vjp(lambda x, w: fn(x, w, s), a, b)[1](d))


def bench_grouping(name, sizes, lhs, rhs, dout, dense_s, dense_bwd_s, flops, repeats):
  """Rows for one routing: lax.ragged_dot first (the baseline), then each grouped impl,
  and the forward's max relative difference to ragged_dot per impl."""
  base_fwd = time_fn(jax.jit(ragged_dot), lhs, rhs, sizes, repeats=repeats)
  base_bwd = time_fn(vjp_of(ragged_dot), lhs, rhs, sizes, dout, repeats=repeats)
  rows = [('dense bf16 matmul fwd (equal FLOPs)', dense_s, flops, base_fwd),
          ('dense bf16 matmul bwd (2 GEMMs)', dense_bwd_s, 2 * flops, base_bwd),
          ('lax.ragged_dot fwd', base_fwd, flops, base_fwd),
          ('lax.ragged_dot bwd (2 GEMMs)', base_bwd, 2 * flops, base_bwd)]
  reference = jax.jit(ragged_dot)(lhs, rhs, sizes).astype(jnp.float32)
  errors = {}
  for impl in impls_for_backend():
    fn = lambda a, b, s, impl=impl: kernels.grouped_matmul(a, b, s, impl=impl)  # noqa: E731
    fwd = jax.jit(fn)
    rows.append((f'grouped {impl} fwd', time_fn(fwd, lhs, rhs, sizes, repeats=repeats),
                 flops, base_fwd))
    rows.append((f'grouped {impl} bwd (2 GEMMs)',
                 time_fn(vjp_of(fn), lhs, rhs, sizes, dout, repeats=repeats), 2 * flops,
                 base_bwd))
    got = fwd(lhs, rhs, sizes).astype(jnp.float32)
    errors[impl] = float(jnp.max(jnp.abs(got - reference)) / jnp.max(jnp.abs(reference)))
  return rows, errors


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  size = parser.add_mutually_exclusive_group()
  size.add_argument('--small', action='store_true', help='CPU-sized shapes')
  size.add_argument('--smoke', action='store_true', help='tiny shapes, one repeat')
  parser.add_argument('--groups', default='balanced,skewed',
                      help=f'comma-separated routings from {sorted(GROUPINGS)}')
  parser.add_argument('--repeats', type=int, default=None)
  args = parser.parse_args(argv)
  groupings = args.groups.split(',')
  unknown = sorted(set(groupings) - set(GROUPINGS))
  if unknown:
    raise SystemExit(f'--groups: unknown {unknown}; choose from {sorted(GROUPINGS)}.')
  shape = SMOKE if args.smoke else SMALL if args.small else FULL
  repeats = args.repeats or (1 if args.smoke else 5 if args.small else 20)
  m, k, n, g = shape['rows'], shape['hidden'], shape['width'], shape['experts']
  keys = jax.random.split(jax.random.key(0), 3)
  lhs = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
  rhs = (jax.random.normal(keys[1], (g, k, n)) / np.sqrt(k)).astype(jnp.bfloat16)
  dout = jax.random.normal(keys[2], (m, n), jnp.bfloat16)
  flops = 2 * m * k * n

  dense = lambda a, b, s: jnp.dot(a, b[0], preferred_element_type=jnp.float32).astype(  # noqa: E731
      jnp.bfloat16)
  no_sizes = jnp.zeros((g,), jnp.int32)
  dense_s = time_fn(jax.jit(dense), lhs, rhs, no_sizes, repeats=repeats)
  dense_bwd_s = time_fn(vjp_of(dense), lhs, rhs, no_sizes, dout, repeats=repeats)
  ceiling = flops / dense_s / 1e12
  device = jax.devices()[0]
  print(f"grouped matmul, {datetime.date.today()}, {device.platform} {device.device_kind}, "
        f"M={m} K={k} N={n} G={g}, bf16 in, f32 accumulate, median of {repeats}")
  for grouping in groupings:
    sizes = GROUPINGS[grouping](m, g)
    loads = np.asarray(sizes)
    rows, errors = bench_grouping(grouping, sizes, lhs, rhs, dout, dense_s, dense_bwd_s,
                                  flops, repeats)
    print_table(f'{grouping} routing: rows per expert min {loads.min()} max {loads.max()}, '
                f'{int((loads == 0).sum())} empty (fraction of the dense bf16 forward rate; '
                'vs ragged_dot = its time / this time)', rows, ceiling, baseline='ragged_dot')
    for impl, error in errors.items():
      print(f"{grouping}: {impl} forward vs lax.ragged_dot, max |diff| / max |ref| "
            f"= {error:.2e}")


if __name__ == '__main__':
  main()
