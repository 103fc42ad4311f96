"""The 'gathered' MoE dispatch (few-token calls such as decode steps) against the dense
reference, forward and gradients, and the one function that picks it; decode steps of
more tokens than 'gathered' takes (sorted 'ragged' in place of the dense reference)
against teacher forcing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import model
from c2jax.model import moe_dispatch
from tests.model.conftest import MLA_OVERRIDES, VOCAB, Model, tiny_cfg

T, D, F, E, K = 3, 8, 6, 8, 2


def _inputs():
  keys = jax.random.split(jax.random.key(0), 5)
  x = jax.random.normal(keys[0], (T, D))
  experts = moe_dispatch.ExpertWeights(*(0.3 * jax.random.normal(k, s) for k, s in zip(
      keys[1:4], [(E, D, F), (E, D, F), (E, F, D)])))
  weights = jax.nn.softmax(jax.random.normal(keys[4], (T, K)), axis=-1)
  indices = jnp.asarray([[1, 5], [5, 5], [0, 7]], jnp.int32)  # a duplicate (replay) too
  return x, weights, indices, experts


def test_gathered_matches_dense_forward_and_gradients():
  x, weights, indices, experts = _inputs()

  def loss(impl, x, weights, experts):
    y = moe_dispatch.DISPATCH[impl](x, weights, indices, experts)
    return jnp.sum(y * jnp.arange(D)), y

  (_, y), grads = jax.value_and_grad(loss, argnums=(1, 2, 3), has_aux=True)(
      "gathered", x, weights, experts)
  (_, y_ref), grads_ref = jax.value_and_grad(loss, argnums=(1, 2, 3), has_aux=True)(
      "dense", x, weights, experts)
  np.testing.assert_allclose(y, y_ref, atol=1e-5)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
    np.testing.assert_allclose(got, want, atol=1e-5)
  # Untouched experts get no gradient.
  unused = [e for e in range(E) if e not in np.asarray(indices)]
  np.testing.assert_array_equal(np.asarray(grads[2].gate_ExDxF)[unused], 0)


def test_select_gathers_only_for_few_unquantised_tokens():
  assert moe_dispatch.select("ragged", "none", 4, 2, 8) is moe_dispatch.gathered
  assert moe_dispatch.select("ragged", "none", 5, 2, 8) is moe_dispatch.ragged
  assert moe_dispatch.select("dense", "mxfp8", 1, 2, 8) is moe_dispatch.dense
  # Against a KV cache the dense reference is never run; training keeps it.
  assert moe_dispatch.select("dense", "none", 5, 2, 8) is moe_dispatch.dense
  assert moe_dispatch.select("dense", "none", 5, 2, 8, decoding=True) is moe_dispatch.ragged
  assert moe_dispatch.select("dense", "none", 4, 2, 8, decoding=True) is moe_dispatch.gathered
  assert moe_dispatch.select("pallas", "none", 5, 2, 8, decoding=True) is moe_dispatch.pallas
  x, weights, indices, experts = _inputs()
  with pytest.raises(ValueError, match="gathered"):
    moe_dispatch.gathered(x, weights, indices, experts, quant="mxfp8")


def test_decode_step_of_many_rows_matches_teacher_forcing():
  """6 rows x K = 2 copies > E = 8: the decode step runs 'ragged' (cfg.moe_impl is the
  dense reference, which the teacher-forced pass runs)."""
  tiny = Model(tiny_cfg(**MLA_OVERRIDES))
  cfg = tiny.cfg
  assert cfg.moe_impl == "dense" and 6 * cfg.moe.num_experts_per_tok > cfg.moe.num_experts
  batch, prompt_length = 6, 4
  tokens = np.random.default_rng(1).integers(0, VOCAB, (batch, prompt_length + 1))
  tokens = jnp.asarray(tokens, jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(prompt_length + 1, dtype=jnp.int32),
                               (batch, prompt_length + 1))
  cache = model.init_cache(cfg, batch, 8, jnp.float32)
  _, _, cache = tiny.apply(tiny.params, tokens[:, :prompt_length],
                           positions_BxL=positions[:, :prompt_length], cache=cache)
  step, aux, _ = tiny.apply(tiny.params, tokens[:, prompt_length:],
                            positions_BxL=positions[:, prompt_length:], cache=cache)
  teacher, teacher_aux, _ = tiny.apply(tiny.params, tokens)
  np.testing.assert_allclose(step[:, 0], teacher[:, prompt_length], atol=1e-4)
  np.testing.assert_array_equal(aux["expert_indices"][:, :, 0],
                                teacher_aux["expert_indices"][:, :, prompt_length])
