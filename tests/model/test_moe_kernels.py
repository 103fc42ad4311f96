"""MoE dispatch through kernels/ and c2jax/quant: moe_impl='pallas' against 'dense' and
'ragged', and quantised expert matmuls (cfg.quant) against the unquantised ones.

Dispatch-level tests call the functions of moe_dispatch directly on one fixed problem
(one compile per variant: forward and gradients in one jitted call); one module-level test
checks that cfg.moe_impl and cfg.quant reach the dispatch. On CPU the Pallas kernels run
interpreted (megablox, the 'pallas' default on CPU).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import config as configlib
from c2jax.model import config as model_config
from c2jax.model import moe, moe_dispatch, variants
from c2jax.model.moe_dispatch import ExpertWeights

T, D, F, E, K = 32, 64, 32, 8, 2  # the tiny variant's D, F, E, K
EMPTY_EXPERT = 3  # routed to by no token: an empty group in every grouped matmul

# Bounds on |y_quant - y| / |y| (Frobenius) for unit-scale random problems. Rounding to
# a format with m mantissa bits has relative error at most 2^-(m+1), uniform within a
# binade, so RMS <= 2^-(m+1)/sqrt(3) per quantised operand: E4M3 (m=3) 0.036, E2M1 (m=1)
# 0.144. Six quantised operands lie on the path from x to y (x twice, three weights, the
# hidden activations); independent errors add in quadrature: sqrt(6) * RMS.
FORWARD_BOUND = {"mxfp8": 0.09, "nvfp4_fwd_mxfp8_bwd": 0.36}
# Gradients also see the forward error (silu' and the hidden activations), so they get the
# two in quadrature: MXFP8 backward GEMMs on top of the forward recipe's error.
GRADIENT_BOUND = {"mxfp8": 0.13, "nvfp4_fwd_mxfp8_bwd": 0.4}


def _problem(seed=0):
  rng = np.random.default_rng(seed)
  normal = lambda *shape: rng.standard_normal(shape)
  x_TxD = normal(T, D)
  # Weights scaled by 1/sqrt(fan-in) keep every activation O(1).
  experts = ExpertWeights(normal(E, D, F) / D**0.5, normal(E, D, F) / D**0.5,
                          normal(E, F, D) / F**0.5)
  used = [e for e in range(E) if e != EMPTY_EXPERT]
  indices_TxK = np.stack([rng.choice(used, K, replace=False) for _ in range(T)])
  weights_TxK = rng.uniform(0.1, 1.0, (T, K))
  cotangent_TxD = normal(T, D)
  as_f32 = lambda a: jnp.asarray(a, jnp.float32)
  return dict(x=as_f32(x_TxD), experts=jax.tree.map(as_f32, experts),
              weights=as_f32(weights_TxK), indices=jnp.asarray(indices_TxK, jnp.int32),
              cotangent=as_f32(cotangent_TxD))


PROBLEM = _problem()
DISPATCHES = {
    "dense": moe_dispatch.dense,
    "ragged": moe_dispatch.ragged,
    "pallas": moe_dispatch.pallas,
}


@functools.cache
def run(dispatch, quant="none"):
  """(y_TxD, (dx_TxD, dexperts)) of `dispatch` on PROBLEM under `quant`, memoised."""
  p = PROBLEM

  def loss(x, experts):
    y = DISPATCHES[dispatch](x, p["weights"], p["indices"], experts, quant=quant)
    return jnp.sum(y * p["cotangent"]), y

  grads, y = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(p["x"], p["experts"])
  return y, grads


def rel_err(a, b):
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def leaves(grads):
  """Named gradient leaves: x and each expert weight."""
  dx, dexperts = grads
  return {"x": dx, **dexperts._asdict()}


def test_problem_has_an_empty_expert():
  assert not np.any(np.asarray(PROBLEM["indices"]) == EMPTY_EXPERT)


def test_pallas_default_kernel_per_platform():
  assert moe_dispatch.pallas_impl("gpu") == "mosaic_gpu"
  assert moe_dispatch.pallas_impl("tpu") == "megablox"
  # No Pallas hardware on CPU: megablox under the interpreter, not lax.ragged_dot.
  assert moe_dispatch.pallas_impl("cpu") == "megablox"


@pytest.mark.parametrize("capability, library_installed, impl", [
    ("10.0", True, "tokamax"), ("10.0", False, "tiled"), ("12.0", True, "tiled")])
def test_pallas_on_a_gpu_without_a_kernel_of_its_own(monkeypatch, capability,
                                                     library_installed, impl):
  """A B200 (sm_100) has no c2jax Mosaic GPU kernel: moe_impl='pallas' runs tokamax's
  Blackwell kernels where the package is installed, else the GPU default ('tiled'), and
  never the TPU's megablox."""
  import types

  from c2jax_kernels import platform as platform_lib
  blackwell = types.SimpleNamespace(platform="gpu", compute_capability=capability)
  monkeypatch.setattr(platform_lib, "target_device", lambda: blackwell)
  monkeypatch.setattr(platform_lib, "library_installed", lambda: library_installed)
  assert moe_dispatch.pallas_impl("gpu") == impl


def test_config_names_the_kernel_behind_pallas():
  """model.grouped_matmul_impl replaces the platform's default (here tokamax, whose XLA
  implementation runs on a CPU) and keeps the dense reference's numbers; an unknown name
  is a ConfigError that lists the choices."""
  cfg = variants.get("tiny", moe_impl="pallas", grouped_matmul_impl="tokamax")
  assert moe_dispatch.grouped_impl(cfg.moe_impl, cfg.grouped_matmul_impl) == "tokamax"
  np.testing.assert_allclose(_module_forward("pallas", "none", "tokamax"),
                             _module_forward("dense", "none"), rtol=0, atol=1e-5)
  with pytest.raises(configlib.ConfigError, match="grouped_matmul_impl.*megablox"):
    model_config.validate(variants.get("tiny", moe_impl="pallas",
                                       grouped_matmul_impl="cutlass"))


@pytest.mark.parametrize("dispatch", ["ragged", "pallas"])
def test_sorted_dispatch_matches_dense(dispatch):
  y_ref, grads_ref = run("dense")
  y, grads = run(dispatch)
  np.testing.assert_allclose(y, y_ref, rtol=0, atol=1e-5)
  for name, ref in leaves(grads_ref).items():
    got = leaves(grads)[name]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * float(jnp.abs(ref).max()),
                               err_msg=f"gradient of {name}")
  # The empty expert gets exactly zero weight gradient from the grouped kernels.
  for name in ("gate_ExDxF", "up_ExDxF", "down_ExFxD"):
    assert not np.any(np.asarray(leaves(grads)[name][EMPTY_EXPERT]))


@pytest.mark.parametrize("quant", ["mxfp8", "nvfp4_fwd_mxfp8_bwd"])
def test_quantised_experts_are_close_to_but_not_float32(quant):
  y_ref, grads_ref = run("ragged")
  y, grads = run("ragged", quant)
  error = rel_err(y, y_ref)
  # Far above float32 rounding (1e-7): the quantised path is really taken.
  assert 1e-3 < error < FORWARD_BOUND[quant], error
  for name, ref in leaves(grads_ref).items():
    got = leaves(grads)[name]
    assert np.all(np.isfinite(got)), name
    assert 1e-3 < rel_err(got, ref) < GRADIENT_BOUND[quant], (name, rel_err(got, ref))


def test_quantised_dense_reference_matches_sorted_dispatch():
  # Same operands quantised along the same axes; only the float32 summation order and,
  # for weight gradients, the token blocks (power-of-two scales rarely change a rounding)
  # differ between the per-expert dots and the grouped GEMMs.
  y_ref, grads_ref = run("dense", "mxfp8")
  y, grads = run("ragged", "mxfp8")
  np.testing.assert_allclose(y, y_ref, rtol=0, atol=1e-5)
  for name, ref in leaves(grads_ref).items():
    assert rel_err(leaves(grads)[name], ref) < 1e-4, name


# Module level: the config fields choose the dispatch and the recipe.
B, L = 2, 16


def _module_forward(moe_impl, quant, grouped_matmul_impl="auto"):
  cfg = variants.get("tiny", init_std=0.2, moe_impl=moe_impl, quant=quant,
                     grouped_matmul_impl=grouped_matmul_impl)
  x_BxLxD = jax.random.normal(jax.random.key(1), (B, L, cfg.hidden_size))
  layer = moe.MoE(cfg)
  params = nn.unbox(jax.eval_shape(layer.init, jax.random.key(0), x_BxLxD))["params"]
  rng = np.random.default_rng(2)
  params = jax.tree.map(
      lambda s: jnp.asarray(cfg.init_std * rng.standard_normal(s.shape), s.dtype), params)
  y_BxLxD, _ = jax.jit(layer.apply)({"params": params}, x_BxLxD)
  return y_BxLxD


def test_config_selects_pallas_dispatch_and_quant_recipe():
  y_pallas_q = _module_forward("pallas", "mxfp8")
  y_dense_q = _module_forward("dense", "mxfp8")
  y_dense = _module_forward("dense", "none")
  np.testing.assert_allclose(y_pallas_q, y_dense_q, rtol=0, atol=1e-5)
  assert 1e-3 < rel_err(y_dense_q, y_dense) < FORWARD_BOUND["mxfp8"]
