"""MoE MTP blocks are balanced like the trunk's MoE layers: their routing stats come out of
`mtp.apply` / `mtp.loss`, their balance loss joins the train step's aux_loss, and their
expert loads nudge their own correction biases (also when the trunk is frozen)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import train
from c2jax.model import moe, mtp
from c2jax.train.step import MTPWeights
from tests.model.conftest import random_params, tiny_cfg

B, L, VOCAB, DEPTHS = 2, 12, 32, 2
RATE, COEF = 0.05, 0.01


@pytest.fixture(scope="module")
def setup():
  cfg = tiny_cfg(vocab_size=VOCAB, num_layers=2, num_mtp_layers=DEPTHS,
                 moe=dict(bias_update_rate=RATE, aux_loss_coef=COEF))
  params = random_params(cfg, seed=5)
  tokens = np.random.default_rng(1).integers(0, VOCAB, (B, L + 1))
  segments = np.ones((B, L), np.int32)
  segments[1, -3:] = 0  # padding: computed, but kept out of the routing statistics
  batch = {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
           "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
           "positions": jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L)),
           "segment_ids": jnp.asarray(segments),
           "loss_mask": jnp.asarray(segments, jnp.float32)}
  return cfg, params, batch


def _mtp_aux(cfg, params, batch):
  """The MTP blocks' routing stats and the trunk's aux, from the same forward as train."""
  kwargs = dict(positions_BxL=batch["positions"], segment_ids_BxL=batch["segment_ids"])
  _, trunk_aux, _, hidden = mtp.forward_with_hidden(cfg, params, batch["inputs"], **kwargs)
  _, mtp_aux = mtp.apply(cfg, params, hidden, batch["inputs"], **kwargs)
  return trunk_aux, mtp_aux


def test_apply_reports_the_blocks_routing_stats(setup):
  cfg, params, batch = setup
  _, mtp_aux = jax.jit(functools.partial(_mtp_aux, cfg))(params, batch)
  loads = np.asarray(mtp_aux["expert_loads"])
  assert mtp.uses_moe(cfg) and loads.shape == (DEPTHS, cfg.moe.num_experts)
  valid = int(np.sum(np.asarray(batch["segment_ids"]) != 0))
  np.testing.assert_allclose(loads.sum(-1), valid * cfg.moe.num_experts_per_tok)
  assert not np.array_equal(loads[0], loads[1])  # each depth routes with its own router
  assert float(mtp_aux["aux_loss"]) > 0


def test_dense_mtp_blocks_report_empty_stats():
  cfg = tiny_cfg(vocab_size=VOCAB, num_layers=1, first_k_dense=1, num_mtp_layers=1)
  params = random_params(cfg)
  tokens = jnp.zeros((1, 4), jnp.int32)
  hidden = jnp.zeros((1, 4, cfg.hidden_size))
  _, mtp_aux = mtp.apply(cfg, params, hidden, tokens)
  assert not mtp.uses_moe(cfg) and "moe" not in params[mtp.PARAMS_KEY]["block"]
  assert mtp_aux["expert_loads"].shape == (0, cfg.moe.num_experts)
  assert float(mtp_aux["aux_loss"]) == 0.0


# The joint case adds a compile of its own; the frozen one already checks the MTP path.
@pytest.mark.parametrize("frozen", [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=["frozen", "joint"])
def test_train_step_balances_the_mtp_blocks(setup, frozen):
  cfg, params, batch = setup
  trunk_aux, mtp_aux = jax.jit(functools.partial(_mtp_aux, cfg))(params, batch)
  opt, _ = train.make_optimizer(learning_rate=1e-3, total_steps=2)
  state = train.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                           opt_state=opt.init(params))
  step = jax.jit(functools.partial(train.train_step, cfg, opt,
                                   mtp=MTPWeights(frozen_trunk=frozen)))
  new_state, metrics = step(state, batch)
  # The balance loss is the trunk's plus the MTP blocks', and it is in the loss.
  np.testing.assert_allclose(metrics["aux_loss"],
                             trunk_aux["aux_loss"] + mtp_aux["aux_loss"], rtol=1e-5)
  np.testing.assert_allclose(
      metrics["loss"], metrics["ce_loss"] + metrics["aux_loss"] + metrics["mtp_loss"],
      rtol=1e-5)
  assert "mtp_expert_loads" not in metrics  # an array, not a scalar metric
  # Each stack's correction biases follow its own loads (the trunk's only when trained).
  expected_mtp = moe.update_correction_bias(params[mtp.PARAMS_KEY],
                                            mtp_aux["expert_loads"], RATE)
  bias = lambda tree: tree["block"]["moe"]["router"]["correction_bias"]
  np.testing.assert_allclose(bias(new_state.params[mtp.PARAMS_KEY]), bias(expected_mtp),
                             atol=1e-7)
  assert not np.allclose(bias(new_state.params[mtp.PARAMS_KEY]),
                         bias(params[mtp.PARAMS_KEY]))
  trunk_bias = lambda p: p["moe_layers"]["moe"]["router"]["correction_bias"]
  expected_trunk = (trunk_bias(params) if frozen else trunk_bias(
      moe.update_correction_bias({"moe_layers": params["moe_layers"]},
                                 trunk_aux["expert_loads"], RATE)))
  np.testing.assert_allclose(trunk_bias(new_state.params), expected_trunk, atol=1e-7)
