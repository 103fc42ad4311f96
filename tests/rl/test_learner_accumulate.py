"""Gradient accumulation in rl_step: 4 microbatches give the parameters and metrics of the
packed batch taken at once (KL to a reference, router replay with the filter, the MoE
balance loss and MTP self-distillation all in play); each aggregation's normaliser is the
whole batch's."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from c2jax import config as configlib
from c2jax.rl import config as rl_config
from c2jax.rl import job as rl_job
from c2jax.rl.learner import losses
from c2jax.rl.learner import runtime as learner_runtime
from c2jax.rl.learner import step as learner
from c2jax.train import accumulate
from c2jax.train.step import TrainState
from tests.model.conftest import GQA_OVERRIDES, random_params, tiny_cfg

B, L, VOCAB = 8, 16, 64


def _batch(cfg, seed):
  rng = np.random.default_rng(seed)
  valid = np.zeros((B, L), np.int32)
  for row, length in enumerate((16, 11, 7, 16, 0, 13, 4, 16)):
    valid[row, :length] = 1
  loss_mask = valid.copy()
  loss_mask[:, :3] = 0
  loss_mask[3] = 0  # a row of prompt only
  moe_layers = cfg.num_layers - cfg.first_k_dense
  return dict(
      tokens=rng.integers(1, VOCAB, (B, L)).astype(np.int32), valid=valid,
      loss_mask=loss_mask,
      sampler_logprobs=(-3.0 + 0.3 * rng.standard_normal((B, L))).astype(np.float32),
      router_indices=rng.integers(0, cfg.moe.num_experts,
                                  (B, L, moe_layers, cfg.moe.num_experts_per_tok)
                                  ).astype(np.int32),
      advantages=rng.standard_normal(B).astype(np.float32))


@pytest.fixture(scope="module")
def policy():
  moe = dict(GQA_OVERRIDES["moe"], router="sigmoid_bias", aux_loss_coef=0.01,
             replay_filter_factor=0.5)
  cfg = tiny_cfg(**{**GQA_OVERRIDES, "moe": moe, "vocab_size": VOCAB, "num_layers": 1,
                    "first_k_dense": 0, "num_mtp_layers": 1})
  rl_cfg = rl_config.default_config()
  rl_cfg.loss.aggregation = "token_mean"
  rl_cfg.kl.coef, rl_cfg.kl.placement = 0.1, "loss"
  rl_cfg.mtp_loss_weight = 0.5
  rl_config.validate(rl_cfg)
  return cfg, rl_cfg, random_params(cfg)


def _train(cfg, rl_cfg, params, microbatches, steps=2):
  opt = optax.sgd(0.1)  # parameters differ exactly as the gradients do
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt.init(params))
  step = jax.jit(functools.partial(learner.rl_step, rl_cfg, cfg, opt, rollouts_per_step=4,
                                   microbatches=microbatches))
  history = []
  for i in range(steps):
    state, metrics = step(state, params, _batch(cfg, i))
    history.append(jax.device_get(metrics))
  return state, history


@pytest.mark.slow
def test_four_microbatches_match_one_batch(policy):
  cfg, rl_cfg, params = policy
  whole, whole_history = _train(cfg, rl_cfg, params, 1)
  micro, micro_history = _train(cfg, rl_cfg, params, 4)
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(micro.params)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  for first, second in zip(whole_history, micro_history):
    assert set(first) == set(second)
    for key in first:
      np.testing.assert_allclose(second[key], first[key], rtol=1e-5, atol=1e-6, err_msg=key)
  first = whole_history[0]
  assert {"kl", "mtp0/kl", "replay_replaced", "ratio_max"} <= set(first)
  assert first["replay_replaced"] > 0 and first["mtp_grad_norm"] > 0


@pytest.mark.parametrize("aggregation", sorted(losses.AGGREGATIONS))
def test_microbatch_aggregates_add_up_to_the_batch(aggregation):
  rng = np.random.default_rng(0)
  loss_BxL = jnp.asarray(rng.standard_normal((B, L)), jnp.float32)
  mask_BxL = jnp.asarray(rng.random((B, L)) < 0.5, jnp.float32).at[2].set(0.0)
  aggregate = functools.partial(losses.AGGREGATIONS[aggregation], normalizer_tokens=5.0,
                                num_rollouts=3)
  whole = aggregate(loss_BxL, mask_BxL)
  totals = losses.batch_totals(mask_BxL)
  parts = accumulate.split({"loss": loss_BxL, "mask": mask_BxL}, 4)
  summed = sum(aggregate(parts["loss"][i], parts["mask"][i], totals=totals) for i in range(4))
  np.testing.assert_allclose(float(summed), float(whole), rtol=1e-6)


def test_rows_pad_to_microbatches_and_validation_names_the_key():
  cfg = rl_job.job_defaults()
  cfg.learner.groups_per_step, cfg.rl.group_size, cfg.learner.microbatches = 2, 4, 4
  # 9 segments of 8 rollouts: 16 rows, on 2 ranks 8 each, each a multiple of 4.
  assert learner_runtime.batch_rows(cfg, 9, 2) == 16
  assert learner_runtime.batch_rows(cfg, 8, 3) == 12  # 3 ranks x (3 rows -> 4)
  cfg.learner.microbatches = 3
  with pytest.raises(configlib.ConfigError, match="learner.microbatches"):
    rl_job.validate(cfg)
