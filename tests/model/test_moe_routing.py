"""Routers, routing statistics and the correction-bias update, checked by hand."""

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from c2jax.model import moe, moe_routing


def moe_cfg(**overrides):
  c = ml_collections.ConfigDict(dict(
      router="sigmoid_bias", num_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
      norm_topk_prob=True, routed_scaling_factor=1.0, replay_filter_factor=0.0))
  c.update(overrides)
  return c


def logit(p):
  """Inverse sigmoid, so that a router's sigmoid reproduces chosen scores."""
  p = np.asarray(p, np.float64)
  return jnp.asarray(np.log(p / (1 - p)), jnp.float32)


# Groups of two: [0.9, 0.01] [0.6, 0.55] [0.52, 0.5] [0.1, 0.1]; group scores (sum of the
# top two) 0.91, 1.15, 1.02, 0.2. The single best expert (0) lives in a group that loses.
GROUPED_SCORES = [[0.9, 0.01, 0.6, 0.55, 0.52, 0.5, 0.1, 0.1]]


def test_group_limited_top_k_picks_within_the_best_groups():
  scores = jnp.asarray(GROUPED_SCORES, jnp.float32)
  no_bias = jnp.zeros(8)
  grouped = moe_routing.group_limited_top_k(scores, no_bias, moe_cfg(n_group=4, topk_group=2))
  assert sorted(np.asarray(grouped)[0].tolist()) == [2, 3]
  ungrouped = moe_routing.group_limited_top_k(scores, no_bias, moe_cfg())
  assert sorted(np.asarray(ungrouped)[0].tolist()) == [0, 2]
  # Keeping three groups readmits group 0 (0.91 beats 0.2), and with it expert 0.
  three = moe_routing.group_limited_top_k(scores, no_bias, moe_cfg(n_group=4, topk_group=3))
  assert sorted(np.asarray(three)[0].tolist()) == [0, 2]


def test_correction_bias_steers_selection_but_not_weights():
  cfg = moe_cfg(n_group=4, topk_group=2, routed_scaling_factor=2.5)
  bias = jnp.zeros(8).at[4].set(0.5)  # group 2 now scores 1.52 and expert 4 leads overall
  routing = moe_routing.route(logit(GROUPED_SCORES), bias, cfg)
  indices = np.asarray(routing.indices_TxK)[0]
  assert sorted(indices.tolist()) == [2, 4]
  expected = {4: 0.52 / (0.52 + 0.6) * 2.5, 2: 0.6 / (0.52 + 0.6) * 2.5}
  got = dict(zip(indices.tolist(), np.asarray(routing.weights_TxK)[0].tolist()))
  assert got == pytest.approx(expected, rel=1e-5)


def test_sigmoid_weights_without_renormalisation_are_scaled_raw_scores():
  routing = moe_routing.route(logit(GROUPED_SCORES), jnp.zeros(8),
                              moe_cfg(norm_topk_prob=False, routed_scaling_factor=3.0))
  got = dict(zip(np.asarray(routing.indices_TxK)[0].tolist(),
                 np.asarray(routing.weights_TxK)[0].tolist()))
  assert got == pytest.approx({0: 0.9 * 3.0, 2: 0.6 * 3.0}, rel=1e-5)
  np.testing.assert_allclose(routing.scores_TxE, GROUPED_SCORES, rtol=1e-5)


@pytest.mark.parametrize("renormalise", [True, False])
def test_softmax_router(renormalise):
  logits = np.array([[2.0, 0.5, 1.0, -1.0], [0.0, 3.0, 0.1, 2.9]], np.float32)
  cfg = moe_cfg(router="softmax", num_experts=4, norm_topk_prob=renormalise)
  routing = moe_routing.route(jnp.asarray(logits), None, cfg)
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  np.testing.assert_array_equal(routing.indices_TxK, [[0, 2], [1, 3]])
  top = np.take_along_axis(probs, np.array([[0, 2], [1, 3]]), -1)
  if renormalise:
    top = top / top.sum(-1, keepdims=True)
  np.testing.assert_allclose(routing.weights_TxK, top, rtol=1e-6)
  np.testing.assert_allclose(routing.scores_TxE, probs, rtol=1e-6)
  assert not moe_routing.ROUTERS["softmax"].uses_correction_bias


def test_replay_uses_given_experts_and_live_scores():
  cfg = moe_cfg(routed_scaling_factor=2.0)
  replay = jnp.array([[5, 7]], jnp.int32)  # not what the router would choose
  routing = moe_routing.route(logit(GROUPED_SCORES), jnp.zeros(8), cfg, replay)
  np.testing.assert_array_equal(routing.indices_TxK, replay)
  np.testing.assert_allclose(routing.weights_TxK, [[0.5 / 0.6 * 2.0, 0.1 / 0.6 * 2.0]],
                             rtol=1e-5)


def test_expert_loads_count_valid_copies():
  indices = jnp.array([[[0, 1], [1, 2]], [[1, 3], [0, 1]]], jnp.int32)  # [B=2, L=2, K=2]
  np.testing.assert_array_equal(moe_routing.expert_loads(indices, 5), [2, 4, 1, 1, 0])
  valid = jnp.array([[True, False], [True, True]])
  np.testing.assert_array_equal(moe_routing.expert_loads(indices, 5, valid), [2, 3, 0, 1, 0])


def test_sequence_balance_loss_matches_hand_derivation():
  # E=2, K=1, L=2. Sequence 0: both tokens to expert 0, normalised scores
  # [.75, .25] and [.5, .5]: f = 2/(1*2) * [2, 0] = [2, 0], P = [.625, .375] -> 1.25.
  # Sequence 1: one token each, scores uniform: f = [1, 1], P = [.5, .5] -> 1.0.
  scores = jnp.array([[[0.6, 0.2], [0.3, 0.3]], [[0.4, 0.4], [0.7, 0.7]]])
  indices = jnp.array([[[0], [0]], [[0], [1]]], jnp.int32)
  loss = moe_routing.sequence_balance_loss(scores, indices)
  assert float(loss) == pytest.approx((1.25 + 1.0) / 2, rel=1e-6)
  # Masking sequence 1's second token: f = 2/(1*1) * [1, 0] = [2, 0], P = [.5, .5] -> 1.0;
  # a fully masked sequence drops out of the average instead of counting as 0.
  valid = jnp.array([[True, True], [True, False]])
  assert float(moe_routing.sequence_balance_loss(scores, indices, valid)) == pytest.approx(
      (1.25 + 1.0) / 2, rel=1e-6)
  only_first = jnp.array([[True, True], [False, False]])
  assert float(moe_routing.sequence_balance_loss(scores, indices, only_first)) == (
      pytest.approx(1.25, rel=1e-6))


def test_update_correction_bias_direction_and_magnitude():
  bias = jnp.array([[0.0, 0.0, 0.0, 0.0], [0.5, -0.5, 0.0, 0.0]], jnp.float32)  # [Lm=2, E=4]
  kernel = jnp.ones((2, 3, 4))
  params = {"moe_layers": {"moe": {"router": {
      "correction_bias": nn.LogicallyPartitioned(bias, ("layers", "expert")),
      "kernel": kernel}}}}
  loads = jnp.array([[4.0, 0.0, 2.0, 2.0], [1.0, 1.0, 1.0, 1.0]])  # layer means 2 and 1
  new = moe.update_correction_bias(params, loads, rate=0.01)
  router = new["moe_layers"]["moe"]["router"]
  # Over-loaded expert 0 goes down, starved expert 1 up, experts at the mean stay; a
  # balanced layer is left alone.
  np.testing.assert_allclose(router["correction_bias"].value,
                             [[-0.01, 0.01, 0.0, 0.0], [0.5, -0.5, 0.0, 0.0]], atol=1e-7)
  assert router["correction_bias"].names == ("layers", "expert")
  assert router["kernel"] is kernel
  np.testing.assert_array_equal(bias[0], 0.0)  # pure: the input tree is untouched
  with pytest.raises(ValueError, match="correction_bias has shape"):
    moe.update_correction_bias(params, loads[0], rate=0.01)
