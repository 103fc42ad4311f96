"""The MoE's sorted dispatch under cfg.quant='mxfp8' on the fused FP8 kernels (the path a
Hopper GPU selects), run here in Mosaic GPU interpret mode, against the dequantise path
this CPU selects, forward and gradients. Both quantise the same operands along the same
axes (tokens once before the dispatch gather, bf16 expert outputs into the combine), so
they agree to FP32 summation order, far inside the ~3e-2 that MXFP8 itself moves them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model import moe_dispatch
from c2jax.model.moe_dispatch import ExpertWeights
from c2jax_kernels.block_scaled import grouped

T, D, F, E, K = 12, 32, 48, 4, 2


def _problem():
  rng = np.random.default_rng(0)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  experts = ExpertWeights(normal(E, D, F) / D**0.5, normal(E, D, F) / D**0.5,
                          normal(E, F, D) / F**0.5)
  # Expert 2 gets no token; expert 0 most of them (skewed groups).
  indices = np.stack([[0, 1 if t % 3 else 3] for t in range(T)]).astype(np.int32)
  weights = jnp.asarray(rng.uniform(0.1, 1.0, (T, K)), jnp.float32)
  return normal(T, D), weights, jnp.asarray(indices), experts


@pytest.mark.slow
def test_hopper_fused_path_matches_dequantize_path(monkeypatch):
  x, weights, indices, experts = _problem()
  moe = lambda x, experts=experts: moe_dispatch.ragged(x, weights, indices, experts,
                                                      quant="mxfp8")
  cotangent = jnp.asarray(np.random.default_rng(1).standard_normal((T, D)), jnp.float32)

  def forward_and_grads():
    def loss(x, experts):
      y = moe(x, experts)
      return jnp.sum(y * cotangent), y
    grads, y = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(x, experts)
    return [np.asarray(a, np.float64) for a in (y, grads[0], *grads[1])]

  # Fresh wrappers each time: jit and make_jaxpr cache traces by function identity.
  uses_ragged_dot = lambda: "ragged_dot" in str(jax.make_jaxpr(
      jax.grad(lambda x: jnp.sum(moe(x))))(x))
  assert uses_ragged_dot()  # this CPU: dequantise, then the float grouped GEMM
  reference = forward_and_grads()
  # What default_grouped_path answers on a compute-capability 9.x device.
  monkeypatch.setattr(grouped, "default_grouped_path",
                      lambda recipe, device=None: "hopper_fused")
  assert not uses_ragged_dot()  # all expert GEMMs, forward and backward, in FP8 kernels
  fused = forward_and_grads()
  for name, got, ref in zip(("y", "dx", "dgate", "dup", "ddown"), fused, reference):
    scale = np.abs(ref).max()
    # Same quantised operands and FP32 accumulation: only summation order differs.
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * scale, err_msg=name)
  y_fused, y_reference = fused[0], reference[0]
  scale = np.abs(y_reference).max()
  # The quantised result is really quantised (not the float32 expert math).
  y_plain = np.asarray(moe_dispatch.ragged(x, weights, indices, experts), np.float64)
  assert np.abs(y_fused - y_plain).max() > 1e-3 * scale
