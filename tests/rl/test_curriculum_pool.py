"""The curriculum in `c2jax rl`: difficulty order from probe rollouts, applied to the pool."""

import os

import ml_collections
import pytest

from c2jax.rl.tasks import curriculum_pool
from c2jax.rl.tasks.task_pool import TaskPool


def _pool(tmp_path, ids):
  pool = TaskPool(tmp_path / "pool")
  pool.add((task_id, {"n": i}) for i, task_id in enumerate(ids))
  return pool


def test_reorder_changes_the_lease_order_and_keeps_payloads(tmp_path):
  pool = _pool(tmp_path, ["a", "b", "c", "d"])
  assert [t for t, _ in pool.pending_tasks()] == ["a", "b", "c", "d"]
  pool.reorder(["c", "a", "d", "b"])
  leased = [pool.lease("actor0") for _ in range(4)]
  assert [(t, p["n"]) for t, p in leased] == [("c", 2), ("a", 0), ("d", 3), ("b", 1)]
  assert pool.lease("actor0") is None


def test_reorder_must_name_every_pending_task_once(tmp_path):
  pool = _pool(tmp_path, ["a", "b"])
  with pytest.raises(ValueError, match="missing"):
    pool.reorder(["a"])
  with pytest.raises(ValueError, match="not pending"):
    pool.reorder(["a", "b", "z"])


def test_an_interrupted_reorder_loses_no_task(tmp_path):
  _pool(tmp_path, ["a", "b", "c"])
  pending = tmp_path / "pool" / "pending"
  name = sorted(os.listdir(pending))[0]
  os.replace(pending / name, pending / (".reorder." + name))  # killed mid-reorder
  assert sorted(t for t, _ in TaskPool(tmp_path / "pool").pending_tasks()) == ["a", "b", "c"]


def _curriculum(strength):
  return ml_collections.ConfigDict(dict(strength=strength, turns_weight=1.0,
                                        thinking_weight=1.0, probe_samples=1))


def test_curriculum_order_draws_hard_prompts_first():
  ids = [f"p{i}" for i in range(40)]
  hard = set(ids[::4])
  observations = [(i, 12 if i in hard else 1, 400 if i in hard else 10) for i in ids]
  order = curriculum_pool.order(ids, observations, _curriculum(4.0), seed=0)
  assert sorted(order) == sorted(ids)  # every prompt, once
  first = set(order[:len(hard)])
  assert len(first & hard) >= len(hard) - 2
  # Strength 0 ignores difficulty: hard prompts are spread like the rest.
  uniform = curriculum_pool.order(ids, observations, _curriculum(0.0), seed=0)
  assert sorted(uniform) == sorted(ids)
  assert len(set(uniform[:len(hard)]) & hard) < len(hard) - 2
