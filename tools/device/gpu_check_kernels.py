"""Check every GPU kernel path c2jax can select, compiled (not interpreted), on a real GPU.

The suite runs the Pallas kernels in interpret mode on CPU; a kernel that compiles may
still race or index wrongly on the device. This runs each path's forward and both
gradients on fresh random inputs (skewed routing with empty groups, row counts that are
no multiple of a tile, rows past the routed sum) and compares them with a float64 NumPy
reference on the same (bf16- or FP8-rounded) operands, by ||got - ref|| / ||ref||:
- grouped_matmul, impls 'mosaic_gpu' (Hopper WGMMA), 'tiled', 'ragged_dot' and, where
  tokamax is installed, 'tokamax' (its Mosaic GPU kernels);
- block_scaled_grouped_matmul (MXFP8), paths 'hopper_fused' (FP8 WGMMA, scales inside
  the kernel) and 'dequantize', against each other and against the unquantised product;
- block_scaled_matmul, paths 'hopper_fp8' and 'dequantize';
- fused attention (cuDNN through jax.nn.dot_product_attention), causal and packed
  documents, MLA and GQA heads, forward and gradients against the dense float32 one, and
  tokamax's flash attention (where installed) the same way.
Outputs are also checked for NaN and, for the grouped matmuls, for zeros past the routed
rows. One line a check (PASS/FAIL, the error, the bound); exit status 1 if any failed.

  python -m tools.device.gpu_check_kernels            # a GPU
  python -m tools.device.gpu_check_kernels --smoke     # CPU: interpret mode
"""

import argparse
import contextlib
import datetime
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import c2jax_kernels as kernels
from c2jax_kernels import platform
from c2jax_kernels.block_scaled import formats
from tools.bench.attention import dense as dense_attention
from tools.bench.attention import fused_call
from tools.bench.attention import packed_segments
from tools.bench.attention import tokamax_call
from tools.bench.grouped_matmul import skewed_group_sizes

# (rows M, hidden K, width N, groups G): a small ragged case and an expert-layer-like one.
GROUPED_SHAPES = {'ragged': (200, 128, 64, 6), 'layer': (4100, 1024, 512, 16)}
SMOKE_SHAPES = {'ragged': (200, 128, 64, 6)}
ROUTED = 0.9  # of the rows: the rest lie past the routed sum and must come out zero
# Relative Frobenius error bounds: bf16 outputs round at 2^-9 (~2e-3 relative per element);
# float32 outputs of float32 dots may use TF32 on a GPU (~5e-4).
BOUND = {jnp.bfloat16: 1e-2, jnp.float32: 2e-3}
QUANT_BOUND = 8e-2  # MXFP8 E4M3 vs the unquantised product (3 mantissa bits, ~3e-2 seen)
SAME_MATH_BOUND = 4e-3  # same quantised operands; bf16 output rounding alone is ~1.7e-3

failures = []
LIBRARY = platform.library_installed()  # tokamax's kernels are checked too


def report(name, err, bound):
  ok = np.isfinite(err) and err <= bound
  print(f"{'PASS' if ok else 'FAIL'}  {name:<58} err {err:.3e}  bound {bound:.0e}",
        flush=True)
  if not ok:
    failures.append(name)


@contextlib.contextmanager
def recorded(name):
  """A compile or launch failure fails the check `name`, not the run."""
  try:
    yield
  except Exception as error:
    print(f"FAIL  {name}: {type(error).__name__}: {error}", flush=True)
    traceback.print_exc(limit=3)
    failures.append(name)


def rel_err(got, ref):
  got = np.asarray(got, np.float64)
  ref = np.asarray(ref, np.float64)
  if not np.all(np.isfinite(got)):
    return float('nan')
  return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def grouped_reference(lhs, rhs, sizes, dout):
  """float64 forward, d lhs and d rhs of the grouped product; rows past the sum are 0."""
  lhs, rhs, dout = (np.asarray(x, np.float64) for x in (lhs, rhs, dout))
  out, dlhs, drhs = np.zeros((lhs.shape[0], rhs.shape[2])), np.zeros_like(lhs), np.zeros_like(rhs)
  start = 0
  for g, size in enumerate(np.asarray(sizes)):
    rows = slice(start, start + int(size))
    out[rows] = lhs[rows] @ rhs[g]
    dlhs[rows] = dout[rows] @ rhs[g].T
    drhs[g] = lhs[rows].T @ dout[rows]
    start += int(size)
  return out, dlhs, drhs


def with_pullback(fn, dout, *args):
  """fn(*args) and its gradients for the cotangent `dout`, jitted."""
  def both(dout, *args):
    out, pullback = jax.vjp(fn, *args)
    return (out, *pullback(dout.astype(out.dtype)))
  return jax.jit(both)(dout, *args)


def grouped_inputs(rng, shape, dtype):
  m, k, n, g = shape
  sizes = skewed_group_sizes(int(m * ROUTED), g, seed=int(rng.integers(1 << 30)))
  lhs = jnp.asarray(rng.standard_normal((m, k)), dtype)
  rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), dtype)
  dout = jnp.asarray(rng.standard_normal((m, n)), dtype)
  return lhs, rhs, sizes, dout


def check_grouped(impls, shapes, seed, interpret):
  for shape_name, shape in shapes.items():
    rng = np.random.default_rng(seed)
    for dtype in (jnp.bfloat16, jnp.float32):
      lhs, rhs, sizes, dout = grouped_inputs(rng, shape, dtype)
      want = grouped_reference(lhs, rhs, sizes, dout)
      for impl in impls:
        name = f"grouped {impl} {shape_name} {jnp.dtype(dtype).name}"
        if impl == 'mosaic_gpu' and dtype == jnp.float32 and not interpret:
          try:  # WGMMA takes 16-bit operands here: the impl must refuse, naming the fix
            kernels.grouped_matmul(lhs, rhs, sizes, impl=impl)
            print(f"FAIL  {name}: accepted float32 operands", flush=True)
            failures.append(name)
          except ValueError as error:
            print(f"PASS  {name} refused: {str(error)[:70]}...", flush=True)
          continue
        with recorded(name):
          got = with_pullback(
              lambda x, w, impl=impl: kernels.grouped_matmul(x, w, sizes, impl=impl),
              dout, lhs, rhs)
          for part, gv, wv in zip(('out', 'dlhs', 'drhs'), got, want):
            report(f"{name} {part}", rel_err(gv, wv), BOUND[dtype])
          past = np.asarray(got[0][int(sizes.sum()):], np.float32)
          report(f"{name} rows past the sum are zero", float(np.abs(past).max(initial=0.0)),
                 0.0)


def check_block_scaled_grouped(paths, shapes, seed):
  for shape_name, shape in shapes.items():
    lhs, rhs, sizes, dout = grouped_inputs(np.random.default_rng(seed + 1), shape,
                                           jnp.bfloat16)
    unquantised = grouped_reference(lhs, rhs, sizes, dout)
    results = {}
    for path in paths:
      name = f"mxfp8 grouped {path} {shape_name}"
      with recorded(name):
        results[path] = got = with_pullback(
            lambda x, w, path=path: kernels.block_scaled_grouped_matmul(
                x, w, sizes, recipe='mxfp8', path=path), dout, lhs, rhs)
        for part, gv, wv in zip(('out', 'dlhs', 'drhs'), got, unquantised):
          report(f"{name} {part} vs unquantised", rel_err(gv, wv), QUANT_BOUND)
    if len(results) == 2:
      for part, x, y in zip(('out', 'dlhs', 'drhs'), *(results[p] for p in paths)):
        report(f"mxfp8 grouped {paths[0]} vs {paths[1]} {shape_name} {part}", rel_err(x, y),
               SAME_MATH_BOUND)


def check_block_scaled_flat(paths, seed):
  rng = np.random.default_rng(seed + 2)
  m, k, n = 1000, 1024, 768
  a = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  b = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), jnp.bfloat16)
  dout = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
  # The forward multiplies exactly the quantised operands: float64 on those is its twin.
  aq = np.asarray(formats.dequantize(formats.quantize(a, 'mxfp8_e4m3', axis=1)), np.float64)
  bq = np.asarray(formats.dequantize(formats.quantize(b, 'mxfp8_e4m3', axis=0)), np.float64)
  _, dlhs, drhs_1xKxN = grouped_reference(a, b[None], np.array([m]), dout)
  results = {}
  for path in paths:
    name = f"mxfp8 flat {path}"
    with recorded(name):
      results[path] = got = with_pullback(
          lambda u, v, path=path: kernels.block_scaled_matmul(u, v, recipe='mxfp8',
                                                              path=path), dout, a, b)
      report(f"{name} out vs float64 on quantised operands", rel_err(got[0], aq @ bq),
             SAME_MATH_BOUND)
      report(f"{name} dlhs vs unquantised", rel_err(got[1], dlhs), QUANT_BOUND)
      report(f"{name} drhs vs unquantised", rel_err(got[2], drhs_1xKxN[0]), QUANT_BOUND)
  if len(results) == 2:
    for part, x, y in zip(('out', 'dlhs', 'drhs'), *(results[p] for p in paths)):
      report(f"mxfp8 flat {paths[0]} vs {paths[1]} {part}", rel_err(x, y), SAME_MATH_BOUND)


def check_attention(smoke, seed):
  heads = {'mla': (4, 4, 192, 128), 'gqa': (8, 2, 128, 128)}
  if smoke:
    heads = {'mla': (2, 2, 24, 16), 'gqa': (4, 2, 16, 16)}
  batch, length = (1, 64) if smoke else (2, 1024)
  rng = np.random.default_rng(seed + 3)
  calls = {'fused': fused_call}
  if LIBRARY:
    calls['tokamax'] = tokamax_call
  for head_name, (h, kv, e, v_dim) in heads.items():
    for case in ('causal', 'documents'):
      q = jnp.asarray(rng.standard_normal((batch, length, h, e)), jnp.bfloat16)
      k = jnp.asarray(rng.standard_normal((batch, length, kv, e)), jnp.bfloat16)
      v = jnp.asarray(rng.standard_normal((batch, length, kv, v_dim)), jnp.bfloat16)
      dout = jnp.asarray(rng.standard_normal((batch, length, h, v_dim)), jnp.bfloat16)
      segments = (packed_segments(batch, length, 4, seed=int(rng.integers(1 << 30)))
                  if case == 'documents' else None)
      scale = e ** -0.5
      # The reference: tools/bench/attention.py's dense attention on float32 operands.
      want = with_pullback(lambda *x: dense_attention(*x, segments, scale), dout,
                           *(t.astype(jnp.float32) for t in (q, k, v)))
      for impl, call in calls.items():
        name = f"attention {impl} {head_name} {case}"
        with recorded(name):
          got = with_pullback(lambda *x, call=call: call(*x, segments, scale), dout, q, k, v)
          for part, gv, wv in zip(('out', 'dq', 'dk', 'dv'), got, want):
            report(f"{name} {part}", rel_err(gv, wv), 2e-2)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--smoke', action='store_true', help='tiny shapes; any backend')
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  device = jax.devices()[0]
  print(f"{datetime.date.today()}  jax {jax.__version__}  {device.platform} "
        f"{device.device_kind}  capability {getattr(device, 'compute_capability', None)}",
        flush=True)
  on_gpu = device.platform == 'gpu'
  hopper = on_gpu and str(getattr(device, 'compute_capability', '')).startswith('9')
  if not on_gpu and not args.smoke:
    sys.exit("No GPU here: this check is for a GPU (use --smoke for a CPU run).")
  shapes = SMOKE_SHAPES if args.smoke else GROUPED_SHAPES
  impls = (['tiled', 'ragged_dot'] + (['mosaic_gpu'] if hopper or args.smoke else [])
           + (['tokamax'] if LIBRARY else []))
  check_grouped(impls, shapes, args.seed, interpret=not on_gpu)
  grouped_paths = ['hopper_fused', 'dequantize'] if hopper or args.smoke else ['dequantize']
  check_block_scaled_grouped(grouped_paths, shapes, args.seed)
  flat_paths = ['hopper_fp8', 'dequantize'] if hopper or args.smoke else ['dequantize']
  check_block_scaled_flat(flat_paths, args.seed)
  check_attention(args.smoke, args.seed)
  print(f"\n{len(failures)} failed" + (f": {failures}" if failures else ''), flush=True)
  sys.exit(1 if failures else 0)


if __name__ == '__main__':
  main()
