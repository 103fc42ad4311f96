"""tokamax's Hopper grouped-matmul kernels run in Mosaic GPU interpret mode on a CPU.

tokamax picks its sm_90 kernel and sizes its grid from JAX's default device, so the check
makes that a compile-only H100 (XLA's GPU compiler, the gpu-compile venv) while the
operands stay committed to the CPU, where the interpreter simulates shared memory, TMA,
barriers and WGMMA. Each product c2jax's VJP uses (forward, input gradient against the
transposed weights, weight gradient) runs on bf16 operands with a ragged routing (an
empty group, rows past the routed sum) and is compared with float64 on the same rounded
operands; it also records whether rows past the sum come back unwritten (NaN in the
interpreter) and that c2jax's routed_rows_only zeroes them. One JSON line:
{product: {"error": ..., ...} or {"failed": "<the interpreter's error>"}}.

  JAX_PLATFORMS=cpu .venv-gpu/bin/python -m tools.compile.library_interpret
"""

import json

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.plan import topologies
from c2jax_kernels.grouped_matmul import library

SIZES = np.array([50, 0, 70, 60], np.int32)  # one empty group; rows 180.. past the sum
M, K, N = 200, 128, 64


def expected(lhs, rhs, dout):
  """float64 products per group on the bf16-rounded operands."""
  out = {'forward': np.zeros((M, N)), 'input_gradient': np.zeros((M, K)),
         'weight_gradient': np.zeros((len(SIZES), K, N))}
  ends = np.cumsum(SIZES)
  for g, (start, end) in enumerate(zip(ends - SIZES, ends)):
    out['forward'][start:end] = lhs[start:end] @ rhs[g]
    out['input_gradient'][start:end] = dout[start:end] @ rhs[g].T
    out['weight_gradient'][g] = lhs[start:end].T @ dout[start:end]
  return out


def main():
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  gpu = topologies.parse_target('h100-8').devices()[0]
  cpu = jax.devices('cpu')[0]
  rng = np.random.default_rng(0)
  operands = [jnp.asarray(x, jnp.bfloat16) for x in (
      rng.standard_normal((M, K)), rng.standard_normal((len(SIZES), K, N)) / np.sqrt(K),
      rng.standard_normal((M, N)))]
  want = expected(*(np.asarray(x, np.float64) for x in operands))
  lhs, rhs, dout = (jax.device_put(x, cpu) for x in operands)
  sizes = jax.device_put(jnp.asarray(SIZES), cpu)
  calls = {'forward': (lhs, rhs, library.FORWARD),
           'input_gradient': (dout, rhs, library.TRANSPOSED_RHS),
           'weight_gradient': (lhs, dout, library.RAGGED_CONTRACTING)}
  routed = int(SIZES.sum())
  report = {}
  for name, (a, b, numbers) in calls.items():
    try:
      with jax.default_device(gpu), plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        raw = jax.jit(lambda a, b, s, numbers=numbers: library.call(
            a, b, s, numbers, jnp.float32, library.gpu_kernel(9)))(a, b, sizes)
    except Exception as error:  # pylint: disable=broad-except
      report[name] = {'failed': f'{type(error).__name__}: {str(error).splitlines()[-1][:200]}'}
      continue
    raw = np.asarray(raw, np.float64)
    if name == 'weight_gradient':
      got, ref = raw, want[name]
      entry = {'empty_group_max': float(np.abs(raw[1]).max())}
    else:
      got, ref = raw[:routed], want[name][:routed]
      masked = np.asarray(library.routed_rows_only(jnp.asarray(raw), sizes))
      entry = {'past_sum_unwritten': bool(np.isnan(raw[routed:]).all()),
               'past_sum_after_mask': float(np.abs(masked[routed:]).max())}
    report[name] = {'error': float(np.linalg.norm(got - ref) / np.linalg.norm(ref)), **entry}
  print(json.dumps(report))


if __name__ == '__main__':
  main()
