"""Benchmark: block-scaled (MXFP8, NVFP4) matmul vs bf16, forward and forward+backward.

Quantisation of both operands is inside the timed call, as in training. Kimi-K2.5-like
expert GEMM (32768 x 7168 x 2048) by default; `--small` for a quick CPU run.

  PYTHONPATH=. python tools/bench/bench_block_scaled.py [--small]
"""

import argparse
import datetime

import jax
import jax.numpy as jnp

import kernels
from bench_grouped_matmul import FULL
from bench_grouped_matmul import SMALL
from bench_grouped_matmul import print_table
from bench_grouped_matmul import time_fn


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--small', action='store_true', help='tiny shapes for a CPU run')
  parser.add_argument('--repeats', type=int, default=None)
  args = parser.parse_args()
  shape = SMALL if args.small else FULL
  repeats = args.repeats or (5 if args.small else 20)
  m, k, n = shape['rows'], shape['hidden'], shape['width']
  keys = jax.random.split(jax.random.key(0), 3)
  a = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
  b = (jax.random.normal(keys[1], (k, n)) / k**0.5).astype(jnp.bfloat16)
  dy = jax.random.normal(keys[2], (m, n), jnp.bfloat16)
  flops = 2 * m * k * n

  def bf16(x, w):
    return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16)

  cases = [('bf16', bf16)]
  for recipe in kernels.BLOCK_SCALED_RECIPES:
    for path in kernels.block_scaled.PATHS:
      cases.append((f'{recipe} [{path}]', lambda x, w, recipe=recipe, path=path:
                    kernels.block_scaled_matmul(x, w, recipe=recipe, path=path)))
  rows, ceiling = [], None
  for name, fn in cases:
    fwd = jax.jit(fn)
    bwd = jax.jit(lambda x, w, d, fn=fn: jax.vjp(fn, x, w)[1](d))
    fwd_s = time_fn(fwd, a, b, repeats=repeats)
    ceiling = ceiling or flops / fwd_s / 1e12
    rows.append((f'{name} fwd', fwd_s, flops))
    rows.append((f'{name} bwd (2 GEMMs)', time_fn(bwd, a, b, dy, repeats=repeats),
                 2 * flops))
  device = jax.devices()[0]
  print(f"block-scaled matmul, {datetime.date.today()}, {device.platform} "
        f"{device.device_kind}, M={m} K={k} N={n}, bf16 operands, median of {repeats}")
  print_table('(fraction of the dense bf16 forward rate)', rows, ceiling)


if __name__ == '__main__':
  main()
