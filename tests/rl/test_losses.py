"""Aggregations, policy losses and rl_loss against hand-derived values and gradients."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import config as configlib
from c2jax import rl
from c2jax.rl.learner import losses

LOSS_BxL = jnp.array([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
MASK_BxL = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def _cfg(**overrides):
  cfg = rl.default_config()
  for dotted, value in overrides.items():
    section, key = dotted.split("__")
    cfg[section][key] = value
  return cfg


def test_aggregations_hand_values():
  # Masked sum 1 + 2 + 3 + 4 = 10 over 4 tokens; 3 rows (one empty); sequences 6/3, 4/1.
  # `constant` divides by rollouts (here 3) x 5, not by the row count.
  np.testing.assert_allclose(float(losses.constant(LOSS_BxL, MASK_BxL, 5.0, 3)), 10 / 15)
  np.testing.assert_allclose(float(losses.constant(LOSS_BxL, MASK_BxL, 5.0, 2)), 10 / 10)
  np.testing.assert_allclose(float(losses.token_mean(LOSS_BxL, MASK_BxL, 5.0, 3)), 2.5)
  np.testing.assert_allclose(float(losses.sequence_mean(LOSS_BxL, MASK_BxL, 5.0, 3)), 3.0)


def test_constant_normaliser_has_no_length_bias():
  # d(agg)/d(loss_bt): the same for every token under `constant`; 1/len_b per sequence
  # under `sequence_mean` (tokens of short sequences weigh more).
  g_const = jax.grad(losses.constant)(LOSS_BxL, MASK_BxL, 5.0, 3)
  np.testing.assert_allclose(np.asarray(g_const), np.asarray(MASK_BxL) / 15)
  g_seq = jax.grad(losses.sequence_mean)(LOSS_BxL, MASK_BxL, 5.0, 3)
  np.testing.assert_allclose(np.asarray(g_seq)[:2, :1], [[1 / 6], [1 / 2]], rtol=1e-6)


def _pg_grad(name, logp, logq, adv, **cfg_overrides):
  cfg = _cfg(**cfg_overrides).loss
  mask = jnp.ones((1, 1))
  fn = lambda lp: losses.POLICY_LOSSES[name](lp, jnp.full((1, 1), logq),
                                             jnp.full((1, 1), adv), mask, cfg)[0].sum()
  lp = jnp.full((1, 1), logp)
  return float(fn(lp)), float(jax.grad(fn)(lp)[0, 0])


def test_tis_truncates_the_ratio_and_stops_its_gradient():
  half, quarter = math.log(0.5), math.log(0.25)
  # ratio 2 capped at 1.5: loss = -1.5 * A * log pi, gradient -1.5 * A.
  loss, grad = _pg_grad("tis", half, quarter, 2.0, loss__tis_cap=1.5)
  np.testing.assert_allclose([loss, grad], [-1.5 * 2.0 * half, -3.0], rtol=1e-6)
  # ratio 1/2 is below the cap: weight 1/2.
  _, grad = _pg_grad("tis", quarter, half, 2.0, loss__tis_cap=1.5)
  np.testing.assert_allclose(grad, -1.0, rtol=1e-6)
  # On-policy it is plain REINFORCE: gradient -A.
  _, grad = _pg_grad("tis", half, half, -0.7)
  np.testing.assert_allclose(grad, 0.7, rtol=1e-6)


@pytest.mark.parametrize("ratio, adv, loss, grad", [
    (2.0, 1.0, -1.28, 0.0),    # above 1 + clip_high with A > 0: clipped, no gradient
    (2.0, -1.0, 2.0, 2.0),     # A < 0 keeps the unclipped term: grad -A * ratio
    (0.5, 1.0, -0.5, -0.5),    # A > 0 below 1 - clip_low keeps the unclipped term
    (0.5, -1.0, 0.8, 0.0),     # A < 0 below 1 - clip_low: clipped
])
def test_ppo_clipping_cases(ratio, adv, loss, grad):
  out = _pg_grad("ppo", math.log(ratio * 0.1), math.log(0.1), adv,
                 loss__clip_low=0.2, loss__clip_high=0.28)
  np.testing.assert_allclose(out, [loss, grad], rtol=1e-5, atol=1e-7)


def test_rl_loss_k1_in_reward_hand_values():
  cfg = _cfg(kl__coef=0.5, kl__estimator="k1", kl__placement="reward",
             loss__normalizer_tokens=4.0, loss__aggregation="constant")
  sampler = jnp.array([[-1.0, -2.0, -3.0]])
  ref = jnp.array([[-1.5, -1.0, -9.0]])
  mask = jnp.array([[1.0, 1.0, 0.0]])
  adv = jnp.array([1.0])
  # k1 = sampler - ref = [.5, -1, (6 masked)]; to go [-.5, -1, 0]; A_t = 1 - .5 * to go.
  fn = lambda lp: rl.rl_loss(cfg, lp, sampler, ref, adv, mask, num_rollouts=1)
  (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(sampler)
  np.testing.assert_allclose(float(loss), (1.25 * 1 + 1.5 * 2) / 4, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(grad), [[-1.25 / 4, -1.5 / 4, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(float(metrics["kl"]), -0.25, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["ratio_mean"]), 1.0)
  assert float(metrics["tokens"]) == 2.0


def test_rl_loss_k3_in_loss_adds_its_gradient():
  cfg = _cfg(kl__coef=0.5, kl__estimator="k3", kl__placement="loss",
             loss__normalizer_tokens=4.0)
  logp = jnp.array([[-1.0, -2.0]])
  ref = jnp.array([[-1.5, -1.0]])
  mask = jnp.ones((1, 2))
  fn = lambda lp: rl.rl_loss(cfg, lp, logp, ref, jnp.zeros(1), mask, num_rollouts=1)
  (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(logp)
  k3 = [math.exp(-0.5) - 0.5, math.exp(1.0) - 2.0]
  np.testing.assert_allclose(float(loss), 0.5 * sum(k3) / 4, rtol=1e-6)
  # d k3 / d log pi = 1 - exp(log p - log pi).
  expected = [0.5 / 4 * (1 - math.exp(-0.5)), 0.5 / 4 * (1 - math.e)]
  np.testing.assert_allclose(np.asarray(grad), [expected], rtol=1e-5)
  np.testing.assert_allclose(float(metrics["kl"]), sum(k3) / 2, rtol=1e-6)


def test_rl_loss_padding_with_extreme_logprobs_stays_finite_and_jits():
  cfg = _cfg(kl__coef=0.0)
  logp = jnp.array([[-1.0, 0.0]])
  sampler = jnp.array([[-1.0, -500.0]])  # padding: exp(500) would be inf
  mask = jnp.array([[1.0, 0.0]])
  loss_and_grad = jax.jit(jax.value_and_grad(
      lambda lp: rl.rl_loss(cfg, lp, sampler, None, jnp.array([2.0]), mask, num_rollouts=1),
      has_aux=True))
  (loss, metrics), grad = loss_and_grad(logp)
  assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))
  np.testing.assert_allclose(float(metrics["ratio_max"]), 1.0)
  assert "kl" not in metrics


def test_rl_loss_needs_ref_when_kl_is_on():
  with pytest.raises(ValueError, match="ref_logprobs"):
    rl.rl_loss(_cfg(kl__coef=0.1), jnp.zeros((1, 2)), jnp.zeros((1, 2)), None,
               jnp.zeros(1), jnp.ones((1, 2)), num_rollouts=1)


def test_constant_weight_does_not_depend_on_segments():
  # Two rollouts (one group of 2), on-policy TIS (gradient -A per token):
  #   rollout a (A = +1): 3 generated tokens in one segment          -> row 0
  #   rollout b (A = -1): 4 generated tokens, a self-summary cut it  -> rows 1 and 2
  # Every token's gradient is -A / (2 rollouts x N = 4): a summary does not halve it,
  # and on log-probs of -1 the token losses are A, so the loss is (3 - 4) / 8.
  cfg = _cfg(kl__coef=0.0, loss__normalizer_tokens=4.0, loss__aggregation="constant")
  mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
  adv = jnp.array([1.0, -1.0, -1.0])  # the chain's advantage on both of b's rows
  logp = -jnp.ones((3, 3))
  fn = lambda lp: rl.rl_loss(cfg, lp, logp, None, adv, mask, num_rollouts=2)
  (loss, _), grad = jax.value_and_grad(fn, has_aux=True)(logp)
  np.testing.assert_allclose(float(loss), -(3 * -1.0 + 4 * 1.0) / 8, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(grad), -np.asarray(adv)[:, None] * mask / 8,
                             rtol=1e-6)
  # The same rollout b unsplit (one row of 4 tokens) gets the same per-token weight.
  mask_one = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
  fn_one = lambda lp: rl.rl_loss(cfg, lp, -jnp.ones((2, 4)), None, jnp.array([1.0, -1.0]),
                                 mask_one, num_rollouts=2)
  (loss_one, _), grad_one = jax.value_and_grad(fn_one, has_aux=True)(-jnp.ones((2, 4)))
  np.testing.assert_allclose(float(loss_one), float(loss), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(grad_one)[1], [1 / 8] * 4, rtol=1e-6)


def test_rl_loss_needs_a_rollout_count():
  with pytest.raises(ValueError, match="num_rollouts"):
    rl.rl_loss(_cfg(kl__coef=0.0), jnp.zeros((1, 2)), jnp.zeros((1, 2)), None,
               jnp.zeros(1), jnp.ones((1, 2)), num_rollouts=0)


def test_mismatch_mask_drops_the_gradient_of_tokens_outside_the_band():
  # Ratios pi / mu per token: 1, 3 (above high), 0.25 (below low), 1.5; on-policy-like
  # TIS with A = 1: a kept token's gradient is -min(ratio, cap) / (1 rollout x 4 tokens).
  ratios = np.array([[1.0, 3.0, 0.25, 1.5]])
  sampler = jnp.full((1, 4), -2.0)
  logp = sampler + jnp.log(jnp.asarray(ratios, jnp.float32))
  mask = jnp.ones((1, 4))

  def grad_and_metrics(**overrides):
    cfg = _cfg(kl__coef=0.0, loss__normalizer_tokens=4.0, loss__tis_cap=2.0, **overrides)
    fn = lambda lp: rl.rl_loss(cfg, lp, sampler, None, jnp.ones(1), mask, num_rollouts=1)
    (_, metrics), grad = jax.value_and_grad(fn, has_aux=True)(logp)
    return np.asarray(grad)[0], metrics

  grad_off, metrics_off = grad_and_metrics()
  np.testing.assert_allclose(grad_off, [-1 / 4, -2 / 4, -0.25 / 4, -1.5 / 4], rtol=1e-5)
  assert "mismatch_masked" not in metrics_off
  grad_token, metrics = grad_and_metrics(mismatch_mask__mode="token", mismatch_mask__low=0.5,
                                         mismatch_mask__high=2.0)
  np.testing.assert_allclose(grad_token, [-1 / 4, 0.0, 0.0, -1.5 / 4], rtol=1e-5)
  np.testing.assert_allclose(float(metrics["mismatch_masked"]), 0.5)
  # 'sequence': the row's geometric mean (1 x 3 x 0.25 x 1.5) ** (1/4) = 1.03 is in the
  # band, so every token keeps its gradient; a band of [0.5, 1.02] drops the whole row.
  grad_seq, _ = grad_and_metrics(mismatch_mask__mode="sequence")
  np.testing.assert_allclose(grad_seq, grad_off, rtol=1e-6)
  grad_seq, metrics = grad_and_metrics(mismatch_mask__mode="sequence",
                                       mismatch_mask__high=1.02)
  np.testing.assert_allclose(grad_seq, 0.0)
  np.testing.assert_allclose(float(metrics["mismatch_masked"]), 1.0)


@pytest.mark.parametrize("overrides, key", [
    (dict(mode="tokens"), "rl.mismatch_mask.mode"),
    (dict(mode="token", low=1.5), "rl.mismatch_mask.low"),
    (dict(mode="token", high=0.9), "rl.mismatch_mask.low"),
])
def test_mismatch_mask_validation_names_the_key(overrides, key):
  cfg = rl.default_config()
  cfg.mismatch_mask.update(overrides)
  with pytest.raises(configlib.ConfigError, match=key.replace(".", r"\.")):
    rl.validate(cfg)
