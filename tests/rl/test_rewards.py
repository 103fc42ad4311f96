"""Reward terms, chain stats and config validation, against hand-computed values."""

import math

import ml_collections
import numpy as np
import pytest

from c2jax import config as configlib
from c2jax import rl
from c2jax.rl.rewards import terms as rewards


def _reward_cfg():
  cfg = rl.default_config().reward
  cfg.length_penalty.k, cfg.length_penalty.q, cfg.length_penalty.scale = 1.0, 0.5, 0.01
  cfg.length_penalty.weights = ml_collections.ConfigDict(dict(
      thinking_tokens=1.0, tool_call_tokens=0.5, tool_output_tokens=0.0,
      final_message_tokens=1.0, tool_calls=0.0, turns=0.25))
  return cfg


def test_total_reward_by_hand():
  stats = rewards.TrajectoryStats(
      tests_passed=3, tests_total=4, thinking_tokens=1, tool_call_tokens=2,
      tool_output_tokens=100, final_message_tokens=0, turns=4,
      tool_call_counts={"run_shell": 2, "finish": 1}, tool_call_errors=2,
      unfinished_todos=1)
  cfg = _reward_cfg()
  # x = 1 + 0.5 * 2 + 0 + 0 + 0 + 0.25 * 4 = 3; C(3; 1, 0.5) = 2.
  total, terms = rl.total_reward(cfg, stats)
  expected = {"correctness": 0.0, "length_penalty": -0.02, "tool_call_errors": -0.04,
              "unfinished_todos": -0.05, "shell_only": -0.1,
              "behaviour": 0.0}  # off by default (scale 0)
  assert terms.keys() == expected.keys()
  for name, value in expected.items():
    np.testing.assert_allclose(terms[name], value, rtol=1e-6, err_msg=name)
  np.testing.assert_allclose(total, sum(expected.values()), rtol=1e-6)
  cfg.correctness.partial_credit = True
  np.testing.assert_allclose(rl.total_reward(cfg, stats)[1]["correctness"], 0.75)


def test_correctness_all_or_nothing_and_ungraded():
  cfg = _reward_cfg().correctness
  assert rewards.correctness(rewards.TrajectoryStats(4, 4), cfg) == 1.0
  assert rewards.correctness(rewards.TrajectoryStats(0, 0), cfg) == 0.0


def test_shell_only_needs_calls_and_ignores_finish():
  cfg = _reward_cfg().shell_only
  stats = lambda counts: rewards.TrajectoryStats(tool_call_counts=counts)
  assert rewards.shell_only(stats({}), cfg) == 0.0
  assert rewards.shell_only(stats({"finish": 1}), cfg) == 0.0
  assert rewards.shell_only(stats({"run_shell": 3, "read_file": 1}), cfg) == 0.0
  assert rewards.shell_only(stats({"run_shell": 3, "read_file": 0}), cfg) == -0.1


def test_of_chain_sums_counts_and_keeps_the_final_grade():
  a = rewards.TrajectoryStats(thinking_tokens=10, turns=2, tool_call_counts={"grep": 1},
                              tool_call_errors=1, unfinished_todos=3)
  b = rewards.TrajectoryStats(tests_passed=1, tests_total=2, thinking_tokens=5, turns=1,
                              tool_call_counts={"grep": 2, "run_shell": 1})
  chain = rewards.TrajectoryStats.of_chain([a, b])
  assert chain.counts() == {"thinking_tokens": 15, "tool_call_tokens": 0,
                            "tool_output_tokens": 0, "final_message_tokens": 0,
                            "tool_calls": 4, "turns": 3}
  assert (chain.tests_passed, chain.tests_total, chain.unfinished_todos) == (1, 2, 0)
  assert chain.tool_call_counts == {"grep": 3, "run_shell": 1}
  assert chain.tool_call_errors == 1


def test_length_penalty_reward_is_concave_in_length():
  cfg = rl.default_config().reward.length_penalty
  values = [rewards.length_penalty_term(rewards.TrajectoryStats(thinking_tokens=n), cfg)
            for n in (0, 1000, 2000, 3000)]
  steps = np.diff(values)
  assert values[0] == 0.0 and np.all(steps < 0) and np.all(np.diff(steps) > 0)
  # slope 1 at 0: the first token costs `scale`.
  tiny = rewards.length_penalty_term(rewards.TrajectoryStats(thinking_tokens=1), cfg)
  np.testing.assert_allclose(tiny, -cfg.scale * (math.sqrt(1 + cfg.k) - 1) / (cfg.k * 0.5),
                             rtol=1e-5)


def test_errors_name_the_key():
  cfg = _reward_cfg()
  cfg.bogus = ml_collections.ConfigDict(dict(scale=1.0))
  with pytest.raises(ValueError, match="reward.bogus"):
    rl.total_reward(cfg, rewards.TrajectoryStats())
  del cfg.length_penalty.weights["turns"]
  with pytest.raises(ValueError, match="turns"):
    rewards.length_penalty_term(rewards.TrajectoryStats(), cfg.length_penalty)
  with pytest.raises(ValueError, match="tests_passed"):
    rewards.TrajectoryStats(tests_passed=3, tests_total=2)


def test_validate_uses_the_registries():
  rl.validate(rl.default_config())
  for dotted, value, match in [("advantage", "gae", "rl.advantage"),
                               ("kl.estimator", "k4", "rl.kl.estimator"),
                               ("loss.aggregation", "mean", "rl.loss.aggregation"),
                               ("router_replay.factor", 1.5, "router_replay.factor")]:
    cfg = rl.default_config()
    section, _, key = dotted.rpartition(".")
    (cfg[section] if section else cfg)[key] = value
    with pytest.raises(configlib.ConfigError, match=match):
      rl.validate(cfg)
