"""Router-replay plausibility filter on hand-built scores."""

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model.replay_filter import filter_replay

SCORES = [0.9, 0.8, 0.1, 0.05, 0.7, 0.3]  # router's top-2: experts 0, 1; k-th score 0.8


def test_hand_cases_with_factor_one_half():
  scores_TxE = jnp.array([SCORES] * 5)
  replay_TxK = jnp.array([
      [0, 4],  # 4 scores 0.7 >= 0.4: kept although outside the router's top-2
      [2, 1],  # 2 scores 0.1 < 0.4: replaced by the best free router choice, 0
      [3, 2],  # both implausible: replaced by 0 then 1
      [1, 0],  # the router's own choice: unchanged
      [5, 2],  # 0.3 and 0.1 both below 0.4
  ])
  out = filter_replay(scores_TxE, replay_TxK, factor=0.5)
  np.testing.assert_array_equal(np.asarray(out.indices_TxK),
                                [[0, 4], [0, 1], [0, 1], [1, 0], [0, 1]])
  np.testing.assert_allclose(float(out.replaced_fraction), 5 / 10)
  np.testing.assert_allclose(float(out.mismatch_fraction), 6 / 10)


def test_valid_mask_restricts_the_fractions():
  scores_TxE = jnp.array([SCORES] * 2)
  replay_TxK = jnp.array([[3, 2], [0, 1]])
  out = filter_replay(scores_TxE, replay_TxK, 0.5, valid_T=jnp.array([False, True]))
  np.testing.assert_array_equal(np.asarray(out.indices_TxK), [[0, 1], [0, 1]])
  assert float(out.replaced_fraction) == 0.0 and float(out.mismatch_fraction) == 0.0


def test_negative_selection_scores_use_relative_slack():
  # k-th (K = 1) score -0.1; threshold -0.1 - 0.5 * 0.1 = -0.15.
  scores_TxE = jnp.array([[-0.2, -0.1, -0.12], [-0.2, -0.1, -0.12]])
  out = filter_replay(scores_TxE, jnp.array([[0], [2]]), factor=0.5)
  np.testing.assert_array_equal(np.asarray(out.indices_TxK), [[1], [2]])


def test_candidates_come_from_the_given_router_choice():
  # Group-limited routing chose {0, 1} although expert 2 scores higher than 1.
  scores_TxE = jnp.array([[0.9, 0.8, 0.85, 0.1]])
  out = filter_replay(scores_TxE, jnp.array([[3, 0]]), 0.5, router_TxK=jnp.array([[0, 1]]))
  np.testing.assert_array_equal(np.asarray(out.indices_TxK), [[1, 0]])


def test_factor_one_random_routes_are_plausible_and_distinct_and_jit():
  key_s, key_r = jax.random.split(jax.random.PRNGKey(0))
  scores_TxE = jax.random.uniform(key_s, (64, 16))
  replay_TxK = jax.vmap(lambda k: jax.random.permutation(k, 16)[:4])(
      jax.random.split(key_r, 64))
  out = jax.jit(filter_replay, static_argnums=2)(scores_TxE, replay_TxK, 1.0)
  idx = np.asarray(out.indices_TxK)
  scores = np.asarray(scores_TxE)
  kth = np.sort(scores, axis=-1)[:, -4]
  assert np.all(np.take_along_axis(scores, idx, -1) >= kth[:, None] - 1e-7)
  assert all(len(set(row)) == 4 for row in idx)
  kept = np.take_along_axis(scores, np.asarray(replay_TxK), -1) >= kth[:, None]
  np.testing.assert_array_equal(idx[kept], np.asarray(replay_TxK)[kept])
  np.testing.assert_allclose(float(out.replaced_fraction), 1 - kept.mean(), rtol=1e-6)
