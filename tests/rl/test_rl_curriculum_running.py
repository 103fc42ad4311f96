"""The running curriculum: weights by hand, statistics from trained groups, the pool feed,
and a restart that restores the statistics from the learner's checkpoint."""

import math

import ml_collections
import numpy as np
import pytest

from c2jax.env import tasks as tasks_lib
from c2jax.rl.tasks import curriculum
from c2jax.rl.tasks import curriculum_pool
from c2jax.rl.actors import rollouts
from c2jax.rl.queue.group_store import Group


def _curriculum(prompts="abcd", **overrides):
  kwargs = dict(ema=0.5, prior_pass=0.5, min_weight=0.1, strength=0.0)
  kwargs.update(overrides)
  return curriculum.RunningCurriculum(list(prompts), 2, **kwargs)


def test_weights_by_hand_learning_signal_floor_and_prior():
  c = _curriculum()
  c.observe_group("a", [1, 1], [1, 1], [5, 5])  # all pass: no signal -> floor 0.1
  c.observe_group("b", [1, 0], [1, 1], [5, 5])  # p = 1/2: s = 1 - 1/4 - 1/4 = 0.5
  c.observe_group("d", [0, 0], [1, 1], [5, 5])  # all fail: floor 0.1; c unseen: prior 1/2
  np.testing.assert_allclose(c.probabilities(), np.array([0.1, 0.5, 0.5, 0.1]) / 1.2)
  # EMA with weight 0.5 on the newest group: a falls to p = 0.5 after one failing group.
  c.observe_group("a", [0, 0], [1, 1], [5, 5])
  assert c.stats["a"].pass_rate == 0.5 and c.stats["a"].groups == 2
  np.testing.assert_allclose(c.probabilities(), np.array([0.5, 0.5, 0.5, 0.1]) / 1.6)
  # Group size 8: s(0.25) = 1 - 0.25^8 - 0.75^8.
  eight = curriculum.RunningCurriculum(["x"], 8, ema=0.3, prior_pass=0.5, min_weight=0.05)
  assert eight.signal(0.25) == pytest.approx(1 - 0.25**8 - 0.75**8)
  metrics = c.metrics()
  p = np.array([0.5, 0.5, 0.5, 0.1]) / 1.6
  assert metrics["curriculum/entropy"] == pytest.approx(-np.sum(p * np.log(p)))
  assert metrics["curriculum/effective_prompts"] == pytest.approx(math.exp(
      metrics["curriculum/entropy"]))
  # Estimated pass rates a .5, b .5, c (prior) .5, d 0.
  assert metrics["curriculum/expected_pass_rate"] == pytest.approx(1.5 * 0.5 / 1.6)
  assert metrics["curriculum/seen_fraction"] == 0.75


def test_a_learned_prompt_moves_down_as_its_groups_pass():
  c = _curriculum("ab", ema=0.3)
  c.observe_group("a", [1, 0], [1, 1], [0, 0])
  c.observe_group("b", [1, 0], [1, 1], [0, 0])
  shares = []
  for _ in range(6):  # the policy has learned a: every new group passes
    c.observe_group("a", [1, 1], [1, 1], [0, 0])
    shares.append(c.probabilities()[0])
  assert all(later < earlier for earlier, later in zip(shares, shares[1:]))
  assert c.stats["a"].pass_rate == pytest.approx(1 - 0.5 * 0.7**6)


def test_difficulty_from_turns_and_thinking_by_hand():
  c = _curriculum("abc", strength=1.0)
  c.observe_group("a", [1, 0], [2, 2], [10, 10])
  c.observe_group("b", [1, 0], [4, 4], [30, 30])
  # Means 3 turns, 20 tokens: d(a) = (2/3 + 1/2) / 2, d(b) = (4/3 + 3/2) / 2, d(c) = 1.
  weights = 0.5 * np.array([(2 / 3 + 0.5) / 2, (4 / 3 + 1.5) / 2, 1.0])
  np.testing.assert_allclose(c.probabilities(), weights / weights.sum())


def test_draws_follow_the_probabilities_and_repeat_for_the_same_indices():
  c = _curriculum()
  c.observe_group("a", [1, 1], [1, 1], [5, 5])
  c.observe_group("d", [0, 0], [1, 1], [5, 5])
  drawn = c.draw(6000, first_index=0)
  freq = [drawn.count(p) / len(drawn) for p in "abcd"]
  np.testing.assert_allclose(freq, c.probabilities(), atol=0.02)
  assert c.draw(5, first_index=17) == c.draw(5, first_index=17)
  assert c.draw(0, first_index=3) == []


def test_state_round_trip_and_bad_inputs():
  c = _curriculum()
  c.observe_group("b", [1, 0], [3, 1], [7, 9])
  again = _curriculum()
  again.load_state(c.state())
  np.testing.assert_allclose(again.probabilities(), c.probabilities())
  assert again.stats == c.stats
  with pytest.raises(ValueError, match="task source changed"):
    _curriculum("ab").load_state({"stats": {"z": dict(pass_rate=1.0, turns=1.0,
                                                      thinking_tokens=0.0, groups=1)}})
  with pytest.raises(KeyError, match="'z'"):
    c.observe_group("z", [1], [1], [1])
  with pytest.raises(ValueError, match="one value per rollout"):
    c.observe_group("a", [1, 0], [1], [1, 1])
  with pytest.raises(ValueError, match="min_weight"):
    _curriculum(min_weight=0.0)
  assert curriculum.prompt_of(curriculum.draw_id("task.7", 12)) == "task.7"
  with pytest.raises(ValueError, match="draw id"):
    curriculum.prompt_of("task-7")


def _feed_cfg(lookahead=3):
  return ml_collections.ConfigDict(dict(
      rl=dict(group_size=2, curriculum=dict(
          sampling="running", strength=0.0, turns_weight=1.0, thinking_weight=1.0,
          probe_samples=0, ema=0.5, prior_pass=0.5, min_weight=0.1, lookahead=lookahead)),
      learner=dict(seed=0)))


def _group(group_id, solved):
  info = dict(solved=solved, turns=[2] * len(solved), thinking_tokens=[4] * len(solved))
  return Group(group_id, 0, np.zeros(len(solved)), np.zeros(len(solved)), [],
               np.zeros(0, np.int32), info)


@pytest.fixture
def dirs(tmp_path):
  dirs = rollouts.RunDirs(tmp_path)
  dirs.train.parent.mkdir(parents=True)
  tasks_lib.save_jsonl([tasks_lib.Task(f"p{i}", "/nonexistent", f"fix {i}",
                                        fail_to_pass=["test_x"])
                        for i in range(4)], str(dirs.train))
  return dirs


def test_feed_keeps_lookahead_draws_and_learns_from_trained_groups(dirs):
  pool = dirs.pool()
  feed = curriculum_pool.PoolFeed(_feed_cfg(), dirs, pool)
  assert feed.start(None) == "the prior" and not pool.exhausted()
  assert feed.top_up() == 3 and feed.top_up() == 0
  leased = [pool.lease("actor0") for _ in range(2)]
  for task_id, payload in leased:
    assert curriculum.prompt_of(task_id) == payload["prompt"] == payload["task"]["id"]
    pool.complete("actor0", task_id)
  assert feed.top_up() == 2  # back to 3 pending or leased
  ids = [t for t, _ in pool.pending_tasks()] + [t for t, _ in leased]
  assert len(set(ids)) == 5 and all(i.endswith(f".draw{n}") for n, i in enumerate(
      [t for t, _ in leased] + [t for t, _ in pool.pending_tasks()]))
  # p0 all pass, p1 half: the step's metrics say what the curriculum expected of them.
  metrics = feed.observe([_group("p0.draw0", [True, True]), _group("p1.draw1", [True, False])])
  assert metrics["curriculum/trained_expected_pass_rate"] == 0.5  # both unseen: prior
  assert feed.curriculum.stats["p0"].pass_rate == 1.0
  np.testing.assert_allclose(feed.curriculum.probabilities(), np.array([0.1, .5, .5, .5]) / 1.6)
  feed.close()
  pool.requeue(None)
  while (leased := pool.lease("actor1")) is not None:
    pool.complete("actor1", leased[0])
  assert pool.exhausted()


def test_restart_restores_statistics_and_never_reuses_a_draw_id(dirs):
  pool = dirs.pool()
  feed = curriculum_pool.PoolFeed(_feed_cfg(), dirs, pool)
  feed.start(None)
  feed.top_up()
  feed.observe([_group("p2.draw0", [False, False]), _group("p3.draw1", [True, False])])
  checkpoint_data = {"curriculum": feed.state()}  # what the learner saves
  feed.observe([_group("p3.draw2", [True, True])])  # trained after the checkpoint: lost
  before = {t for t, _ in pool.pending_tasks()}

  resumed = curriculum_pool.PoolFeed(_feed_cfg(lookahead=5), dirs, dirs.pool())
  assert resumed.start(checkpoint_data) == "the checkpoint"
  assert resumed.curriculum.stats == {
      "p2": curriculum.PromptStats(0.0, 2.0, 4.0, 1),
      "p3": curriculum.PromptStats(0.5, 2.0, 4.0, 1)}
  assert resumed.top_up() == 2
  after = {t for t, _ in dirs.pool().pending_tasks()}
  assert before < after and len(after) == 5  # new draws get new ids


def test_probe_rollouts_seed_the_statistics(dirs):
  (dirs.root / "curriculum.json").write_text(
      '{"observations": [["p1", true, 2, 8], ["p1", false, 4, 0], ["p2", false, 1, 1]]}')
  feed = curriculum_pool.PoolFeed(_feed_cfg(), dirs, dirs.pool())
  assert feed.start(None) == "probe rollouts"
  assert feed.curriculum.stats["p1"] == curriculum.PromptStats(0.5, 3.0, 4.0, 1)
  assert feed.curriculum.stats["p2"].pass_rate == 0.0


def test_an_order_run_cannot_continue_as_running(tmp_path):
  with pytest.raises(FileNotFoundError, match="sampling = 'order'"):
    curriculum_pool.PoolFeed(_feed_cfg(), rollouts.RunDirs(tmp_path), None)


@pytest.mark.parametrize("key, value, message", [
    ("sampling", "weighted", "expected one of"),
    ("ema", 1.5, "at most 1"),
    ("min_weight", 0.0, "> 0"),
    ("lookahead", 1, "actors busy"),
    ("turns_weight", 0.0, "both 0"),
])
def test_config_errors_name_the_key(key, value, message):
  from c2jax import config as configlib
  from c2jax.rl import job

  cfg = job.job_defaults()
  cfg.rl.curriculum.sampling = "running"
  if key == "turns_weight":
    cfg.rl.curriculum.thinking_weight = 0.0
  cfg.rl.curriculum[key] = value
  with pytest.raises(configlib.ConfigError, match=f"rl.curriculum.{key}.*{message}"):
    job.validate(cfg)


def test_running_needs_no_prompt_per_step_but_order_does():
  from c2jax import config as configlib
  from c2jax.rl import job

  cfg = job.job_defaults()
  cfg.tasks.train_count = 3  # 20 steps x 2 groups
  with pytest.raises(configlib.ConfigError, match="sampling = 'running'"):
    job.validate(cfg)
  cfg.rl.curriculum.sampling = "running"
  job.validate(cfg)
  cfg.rl.curriculum.update(sampling="order", strength=1.0, probe_samples=0)
  with pytest.raises(configlib.ConfigError, match="probe_samples"):
    job.validate(cfg)
