"""Advantage estimators against hand-computed values."""

import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.rl.learner import advantages

SQRT3 = np.sqrt(3.0)


def test_hand_values_one_group():
  r = [1.0, 0.0, 0.0, 0.0]  # mean 1/4, population std sqrt(3)/4
  np.testing.assert_allclose(advantages.compute_advantages("dr_grpo", r),
                             [0.75, -0.25, -0.25, -0.25], rtol=1e-6)
  np.testing.assert_allclose(advantages.compute_advantages("grpo", r, std_eps=0.0),
                             [SQRT3, -1 / SQRT3, -1 / SQRT3, -1 / SQRT3], rtol=1e-6)
  # Leave-one-out: 1 - mean(0, 0, 0) = 1; 0 - mean(1, 0, 0) = -1/3.
  np.testing.assert_allclose(advantages.compute_advantages("rloo", r),
                             [1.0, -1 / 3, -1 / 3, -1 / 3], rtol=1e-6)


def test_groups_are_independent_rows():
  r_NxG = jnp.array([[1.0, 3.0], [10.0, 10.0], [0.0, -2.0]])
  np.testing.assert_allclose(advantages.compute_advantages("dr_grpo", r_NxG),
                             [[-1, 1], [0, 0], [1, -1]])
  np.testing.assert_allclose(advantages.compute_advantages("rloo", r_NxG),
                             [[-2, 2], [0, 0], [2, -2]])


def test_identical_rewards_give_zero_and_tiny_spread_blows_up_only_under_grpo():
  same = advantages.compute_advantages("grpo", [0.5, 0.5, 0.5, 0.5], std_eps=1e-6)
  np.testing.assert_array_equal(np.asarray(same), 0.0)
  tiny = [1.0, 1.0, 1.0, 1.0 + 1e-3]
  dr = np.asarray(advantages.compute_advantages("dr_grpo", tiny))
  std = np.asarray(advantages.compute_advantages("grpo", tiny, std_eps=1e-6))
  assert np.abs(dr).max() < 1e-3
  np.testing.assert_allclose(std, [-1 / SQRT3] * 3 + [SQRT3], rtol=1e-2)  # unit scale


def test_errors_name_the_problem():
  with pytest.raises(ValueError, match="dr_grpo"):
    advantages.compute_advantages("ppo", [1.0, 0.0])
  with pytest.raises(ValueError, match="group size >= 2"):
    advantages.compute_advantages("rloo", [[1.0]])
