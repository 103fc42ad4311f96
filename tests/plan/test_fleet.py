"""c2jax/plan/fleet.py: the actor fleet that keeps an RL learner busy, by hand."""

import types

import pytest

from c2jax.plan import fleet


def _estimate(max_lag):
  # 1,000-token rollouts, 600 decoded; 8 slots, 10 ms per decode step; prefill chunks of
  # 256 tokens at 20 ms: ceil(400 / 256) = 2 chunks = 40 ms per rollout.
  rollout = fleet.RolloutShape(total_tokens=1000, decode_tokens=600)
  actor = fleet.ActorSpeed(slots=8, chips=4, decode_step_s=0.01, prefill_tokens=256,
                           prefill_s=0.02)
  return fleet.fleet(rollout, learner_step_s=2.0, rollouts_per_step=64, actor=actor,
                     max_lag=max_lag), actor


def test_meshes_idle_and_lag_by_hand():
  estimate, actor = _estimate(max_lag=4)
  # A mesh: 600 x 10 ms / 8 slots + 40 ms = 0.79 s per rollout; the learner: 32 rollouts/s.
  assert estimate.mesh_rollouts_per_s == pytest.approx(1 / 0.79)
  assert estimate.learner_rollouts_per_s == pytest.approx(32.0)
  assert estimate.meshes == 23 and estimate.chips == 92  # ceil(0.9 x 32 x 0.79) = ceil(22.75)
  assert estimate.idle_fraction(23) == pytest.approx(1 - 23 / 0.79 / 32)
  assert estimate.idle_fraction(22) > 0.1 > estimate.idle_fraction(23)
  assert estimate.idle_fraction(100) == 0.0
  # One rollout on a full mesh: its 600 decode steps plus all 8 slots' prefills.
  assert estimate.rollout_s == pytest.approx(6.0 + 8 * 0.04)
  assert estimate.staleness_steps == pytest.approx(3.16) and estimate.lag_ok
  assert actor.tokens_per_s_per_chip == pytest.approx(8 / 0.01 / 4)
  assert "23 actor mesh(es) (92 chips)" in estimate.line()
  assert "within rl.queue.max_lag = 4" in estimate.line()


def test_a_rollout_slower_than_the_lag_bound_is_named():
  estimate, _ = _estimate(max_lag=2)
  assert not estimate.lag_ok
  assert "beyond rl.queue.max_lag = 2" in estimate.line() and "raise max_lag" in estimate.line()


def test_rollout_shape_from_the_agent_budgets():
  cfg = types.SimpleNamespace(
      agent=types.SimpleNamespace(max_total_tokens=8192, max_turns=8, max_turn_tokens=256),
      actors=types.SimpleNamespace(max_length=4096))
  shape = fleet.RolloutShape.of(cfg)
  assert (shape.total_tokens, shape.decode_tokens, shape.prefill_tokens) == (4096, 2048, 2048)
  cfg.actors.max_length = 1024
  assert fleet.RolloutShape.of(cfg).decode_tokens == 1024  # all of it, at most


def test_times_must_be_positive():
  actor = fleet.ActorSpeed(slots=1, chips=1, decode_step_s=0.0, prefill_tokens=1,
                           prefill_s=0.0)
  with pytest.raises(ValueError, match="times must be positive"):
    fleet.fleet(fleet.RolloutShape(10, 5), learner_step_s=1.0, rollouts_per_step=1,
                actor=actor, max_lag=1)
