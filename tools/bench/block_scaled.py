"""Benchmark: block-scaled (MXFP8, NVFP4) matmul paths vs bf16, forward and backward.

Every path of kernels.block_scaled.PATHS is timed side by side ('scaled_matmul': Blackwell
block-scaled tensor cores via cuDNN; 'hopper_fp8': per-block FP8 GEMMs with FP32 scale
promotion; 'dequantize': portable). Quantisation of both operands is inside the timed call,
as in training. Each path's forward is also checked against 'dequantize' (same math, so
only float32 summation order may differ). Kimi-K2.5-like expert GEMM (32768 x 7168 x
2048) by default; `--small` for a CPU-sized run, `--tiny` for a smoke test.

A second table times the MoE shape itself: `block_scaled_grouped_matmul` per recipe
against the bf16 `grouped_matmul` (both at the platform's default grouped impl) over 48
local experts with skewed routing and empty experts (grouped_matmul.py's
`skewed_group_sizes`), forward and backward, with the speedup over bf16 and the
quantisation error of each recipe's forward. `--smoke` = `--tiny --repeats 1` (the suite).

  python -m tools.bench.block_scaled [--small | --tiny | --smoke]
      [--recipes mxfp8,...] [--paths hopper_fp8,...] [--repeats N] [--no_grouped]
"""

import argparse
import datetime

import jax
import jax.numpy as jnp

import c2jax_kernels as kernels
from c2jax_kernels import platform
from tools.bench.grouped_matmul import FULL
from tools.bench.grouped_matmul import SMALL
from tools.bench.grouped_matmul import print_table
from tools.bench.grouped_matmul import skewed_group_sizes
from tools.bench.grouped_matmul import time_fn

TINY = dict(rows=64, hidden=96, width=32, experts=4)


def names(text, known, flag):
  chosen = text.split(',') if text else sorted(known)
  unknown = sorted(set(chosen) - set(known))
  if unknown:
    raise SystemExit(f"{flag}: unknown {unknown}; choose from {sorted(known)}.")
  return chosen


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  size = parser.add_mutually_exclusive_group()
  size.add_argument('--small', action='store_true', help='CPU-sized shapes')
  size.add_argument('--tiny', action='store_true', help='smoke-test shapes (seconds)')
  size.add_argument('--smoke', action='store_true', help='--tiny with one repeat')
  parser.add_argument('--recipes', default='', help='comma-separated; default all')
  parser.add_argument('--paths', default='', help='comma-separated; default all')
  parser.add_argument('--repeats', type=int, default=None)
  parser.add_argument('--no_grouped', action='store_true',
                      help='skip the grouped (MoE) table')
  args = parser.parse_args(argv)
  shape = TINY if args.tiny or args.smoke else SMALL if args.small else FULL
  repeats = args.repeats or (1 if args.smoke else 20 if shape is FULL else 5)
  recipes = names(args.recipes, kernels.BLOCK_SCALED_RECIPES, '--recipes')
  paths = names(args.paths, kernels.block_scaled.PATHS, '--paths')
  m, k, n = shape['rows'], shape['hidden'], shape['width']
  keys = jax.random.split(jax.random.key(0), 3)
  a = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
  b = (jax.random.normal(keys[1], (k, n)) / k**0.5).astype(jnp.bfloat16)
  dy = jax.random.normal(keys[2], (m, n), jnp.bfloat16)
  flops = 2 * m * k * n

  def bf16(x, w):
    return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16)

  cases = [('bf16', bf16)]
  for recipe in recipes:
    for path in paths:
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
        f"{device.device_kind}, M={m} K={k} N={n}, bf16 operands, median of {repeats}, "
        f"default path here: {kernels.block_scaled.default_path()}")
  print_table('(fraction of the dense bf16 forward rate)', rows, ceiling)

  # float32 outputs here, so that a bf16 rounding of the result does not hide differences.
  print('\nforward agreement with the dequantize path (max |y - y_ref| / max |y_ref|)')
  for recipe in recipes:
    run = lambda path, recipe=recipe: jax.jit(lambda x, w: kernels.block_scaled_matmul(
        x, w, recipe=recipe, path=path, preferred_element_type=jnp.float32))(a, b)
    reference = run('dequantize')
    for path in paths:
      rel = jnp.max(jnp.abs(run(path) - reference)) / jnp.max(jnp.abs(reference))
      print(f"{f'{recipe} [{path}]':<48}{float(rel):>10.2e}")
  if not args.no_grouped:
    grouped_table(shape, recipes, repeats)


def library_quantised_cases(w):
  """tokamax's quantised ragged dots (forward; the weights quantised once, outside the
  timed call, with qwix): FP8 E4M3 weights in blocks of 32 along K (MXFP8's block, scales
  in float32 rather than E8M0) times bf16 activations, tokamax's kernel for this backend
  (Mosaic GPU: sm_90 upcasts the weights inside the kernel; sm_100 also takes FP8
  activations). Empty where tokamax is not installed."""
  if not platform.library_installed():
    return []
  import qwix  # pylint: disable=g-import-not-at-top
  import tokamax  # pylint: disable=g-import-not-at-top
  impl = {'gpu': 'mosaic_gpu', 'tpu': 'mosaic_tpu'}.get(jax.default_backend(), 'xla')
  weights = qwix.quantize(w, jnp.float8_e4m3fn, tiled_axes={1: 32})
  fwd = jax.jit(lambda a, q, s: tokamax.ragged_dot(
      a, q, s, preferred_element_type=jnp.bfloat16, implementation=impl))
  return [(f'tokamax {impl} fp8-weights grouped', fwd, weights)]


def grouped_table(shape, recipes, repeats):
  """FP8/FP4 grouped GEMMs vs the bf16 grouped GEMM at skewed expert loads."""
  m, k, n, g = shape['rows'], shape['hidden'], shape['width'], shape['experts']
  keys = jax.random.split(jax.random.key(1), 3)
  x = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
  w = (jax.random.normal(keys[1], (g, k, n)) / k**0.5).astype(jnp.bfloat16)
  dy = jax.random.normal(keys[2], (m, n), jnp.bfloat16)
  sizes = skewed_group_sizes(m, g)
  flops = 2 * m * k * n
  cases = [('bf16 grouped', lambda a, b, s: kernels.grouped_matmul(a, b, s))]
  for recipe in recipes:
    cases.append((f'{recipe} grouped', lambda a, b, s, recipe=recipe:
                  kernels.block_scaled_grouped_matmul(a, b, s, recipe=recipe)))
  if platform.library_installed():
    cases.append(('tokamax bf16 grouped',
                  lambda a, b, s: kernels.grouped_matmul(a, b, s, impl='tokamax')))
  rows, outputs, base = [], {}, None
  for name, fn in cases:
    fwd = jax.jit(fn)
    bwd = jax.jit(lambda a, b, s, d, fn=fn: jax.vjp(lambda x, w: fn(x, w, s), a, b)[1](d))
    fwd_s = time_fn(fwd, x, w, sizes, repeats=repeats)
    bwd_s = time_fn(bwd, x, w, sizes, dy, repeats=repeats)
    base = base or (fwd_s, bwd_s)
    rows.append((f'{name} fwd', fwd_s, flops, base[0]))
    rows.append((f'{name} bwd (2 GEMMs)', bwd_s, 2 * flops, base[1]))
    outputs[name] = fwd(x, w, sizes).astype(jnp.float32)
  for name, fwd, weights in library_quantised_cases(w):
    try:
      rows.append((f'{name} fwd', time_fn(fwd, x, weights, sizes, repeats=repeats), flops,
                   base[0]))
      outputs[name] = fwd(x, weights, sizes).astype(jnp.float32)
    except Exception as error:  # noqa: BLE001 -- a kernel refusing the case is a result
      print(f'{name}: {type(error).__name__}: {str(error).splitlines()[0][:200]}')
  loads = jax.device_get(sizes)
  print_table(f'\ngrouped (MoE) GEMMs, M={m} K={k} N={n} G={g}, skewed routing: rows per '
              f'expert {loads.min()}..{loads.max()}, {int((loads == 0).sum())} empty; '
              f'grouped impl {kernels.default_grouped_matmul_impl()} (last column: bf16 '
              'grouped time / this time)', rows, flops / base[0] / 1e12,
              baseline='bf16 grouped', ceiling_name='bf16 grouped')
  reference = outputs['bf16 grouped']
  print('\ngrouped forward vs bf16 grouped (quantisation error, max |y - y_bf16| / max |y_bf16|)')
  for name, out in outputs.items():
    rel = jnp.max(jnp.abs(out - reference)) / jnp.max(jnp.abs(reference))
    print(f"{name:<48}{float(rel):>10.2e}")


if __name__ == '__main__':
  main()
