"""The mixed-precision policy: float32 masters keep updates bfloat16 would round away,
matmuls run in the compute dtype, Adam moments live in opt_state_dtype."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from c2jax import model, train
from c2jax.model import variants
from c2jax.train import optimizer as optimizer_lib
from c2jax.train.step import train_step

B, L, V = 2, 8, 64


def _cfg(**policy):
  return variants.get("tiny", vocab_size=V, **policy)


def _batch():
  tokens = jax.random.randint(jax.random.key(1), (B, L + 1), 0, V)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
          "positions": jnp.broadcast_to(jnp.arange(L), (B, L)),
          "segment_ids": jnp.ones((B, L), jnp.int32), "loss_mask": jnp.ones((B, L))}


def _one_step(cfg, learning_rate):
  optimizer, _ = train.make_optimizer(learning_rate=learning_rate, total_steps=10,
                                      weight_decay=0.0, state_dtype=cfg.opt_state_dtype)
  state = train.create_train_state(cfg, optimizer, jax.random.key(0))
  new_state, _ = jax.jit(functools.partial(train_step, cfg, optimizer))(state, _batch())
  return state, new_state


@pytest.mark.parametrize("param_dtype, survives", [("float32", True), ("bfloat16", False)])
def test_a_tiny_update_survives_only_in_float32_masters(param_dtype, survives):
  """Adam's first step moves every weight by ~lr = 1e-6; init weights are ~0.02, where a
  bfloat16 step is ~1e-4: the update rounds away unless the master is float32."""
  cfg = _cfg(dtype="bfloat16", param_dtype=param_dtype, opt_state_dtype="float32")
  before, after = _one_step(cfg, learning_rate=1e-6)
  kernel_before = np.asarray(before.params["lm_head"]["kernel"], np.float32)
  kernel_after = np.asarray(after.params["lm_head"]["kernel"], np.float32)
  assert after.params["lm_head"]["kernel"].dtype == jnp.dtype(param_dtype)
  moved = np.mean(kernel_after != kernel_before)
  if survives:
    assert moved > 0.99
    np.testing.assert_allclose(np.abs(kernel_after - kernel_before).max(), 1e-6, rtol=0.05)
  else:
    assert moved < 0.05
  for moment in jax.tree.leaves(after.opt_state):
    if moment.ndim:  # Adam moments: float32 whatever the parameters are
      assert moment.dtype == jnp.float32


def test_moments_are_stored_in_opt_state_dtype():
  cfg = _cfg(opt_state_dtype="bfloat16")
  optimizer, _ = train.make_optimizer(learning_rate=1e-3, total_steps=10,
                                      state_dtype=cfg.opt_state_dtype)
  state = train.create_train_state(cfg, optimizer, jax.random.key(0))
  moments = [leaf for leaf in jax.tree.leaves(state.opt_state) if leaf.ndim]
  assert moments and all(leaf.dtype == jnp.bfloat16 for leaf in moments)
  assert state.params["lm_head"]["kernel"].dtype == jnp.float32


def test_adam_in_float32_matches_optax_adamw():
  params = {"w": jax.random.normal(jax.random.key(0), (4, 3)), "b": jnp.zeros((3,))}
  ours = optax.chain(optimizer_lib.scale_by_adam(0.9, 0.95, 1e-8, "float32"),
                     optax.scale_by_learning_rate(1e-2))
  reference = optax.adam(1e-2, b1=0.9, b2=0.95, eps=1e-8)
  state_a, state_b = ours.init(params), reference.init(params)
  for step in range(3):
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(step + 10), p.shape),
                         params)
    update_a, state_a = ours.update(grads, state_a, params)
    update_b, state_b = reference.update(grads, state_b, params)
    for a, b in zip(jax.tree.leaves(update_a), jax.tree.leaves(update_b)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)


def _dot_operand_dtypes(jaxpr):
  """(lhs dtype, rhs dtype, rhs shape) of every dot_general, sub-jaxprs included."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      lhs, rhs = (v.aval for v in eqn.invars)
      found.append((lhs.dtype, rhs.dtype, tuple(rhs.shape)))
    for sub in _sub_jaxprs(eqn.params.values()):
      found += _dot_operand_dtypes(sub)
  return found


def _sub_jaxprs(values):
  for value in values:
    if hasattr(value, "eqns"):  # a Jaxpr
      yield value
    elif hasattr(getattr(value, "jaxpr", None), "eqns"):  # a ClosedJaxpr
      yield value.jaxpr
    elif isinstance(value, (tuple, list)):
      yield from _sub_jaxprs(value)


def test_bfloat16_compute_with_float32_masters():
  """Every matmul takes bfloat16 operands, except the router's (float32 by design: its
  scores pick experts); the parameters themselves stay float32."""
  cfg = _cfg(dtype="bfloat16", param_dtype="float32")
  params = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  batch = _batch()
  jaxpr = jax.make_jaxpr(lambda p: train.loss_fn(cfg, p, batch)[0])(params).jaxpr
  dots = _dot_operand_dtypes(jaxpr)
  assert len(dots) > 10
  float32_dots = [d for d in dots if d[0] == jnp.float32 or d[1] == jnp.float32]
  assert all(rhs_shape[-1] == cfg.moe.num_experts for _, _, rhs_shape in float32_dots)
  assert len(float32_dots) < len(dots) / 4
  bf16 = [d for d in dots if d[0] == d[1] == jnp.bfloat16]
  assert len(bf16) == len(dots) - len(float32_dots)
