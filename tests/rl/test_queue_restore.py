"""After any restore: no group is trained twice, and groups sampled by a policy version
ahead of the learner are refused and their prompts rolled out again."""

import json
import queue

import pytest

from c2jax.rl.queue.group_queue import GroupQueue
from c2jax.rl.tasks.task_pool import TaskPool
from c2jax.train.metrics import MetricsWriter

from test_group_queue import make_group


def _drain(q, version):
  out = []
  while True:
    try:
      out.append(q.get(version, timeout=0).group_id)
    except queue.Empty:
      return out


def test_no_group_is_trained_twice_across_restores(tmp_path):
  q = GroupQueue(tmp_path, capacity=16, max_lag=4)
  for name, version in [("a", 0), ("b", 0), ("c", 1), ("d", 1), ("e", 2)]:
    q.put(make_group(name, version))
  trained = []
  for step, count in [(1, 2), (2, 2)]:  # a, b at step 1; c, d at step 2
    ids = [q.get(step - 1).group_id for _ in range(count)]
    q.mark_trained(ids, step)
    trained.append(ids)
  # A learner resumes from the checkpoint at step 2: nothing trained is handed out.
  assert q.recover(2) == 0
  assert _drain(q, 2) == ["e"]
  q.mark_trained(["e"], 3)
  # The step-3 checkpoint was damaged and set aside; the learner falls back to step 2:
  # e (trained at 3, lost with it) comes back once, a-d never.
  assert q.recover(2) == 1
  assert _drain(q, 2) == ["e"]
  q.mark_trained(["e"], 3)
  # It falls back to step 1 instead: c and d (version 1 <= 1) return for step 2; e was
  # sampled by version 2, which this lineage never had, so it is refused.
  assert q.recover(1) == 2
  assert q.refused_ids() == ["e"]
  assert _drain(q, 1) == ["c", "d"]
  assert sorted(sum(q.trained_steps().values(), [])) == ["a", "b"]
  # What every step trained stays in the append-only record, discarded steps marked with
  # the checkpoint step of the resume that discarded them.
  assert [(row["step"], row["groups"], row["discarded"]) for row in q.history()] == [
      (1, ["a", "b"], None), (2, ["c", "d"], 1), (3, ["e"], 2), (3, ["e"], 1)]
  assert len(list((tmp_path / "discarded").glob("*.json"))) == 3


def test_groups_ahead_of_the_learner_are_refused(tmp_path):
  q = GroupQueue(tmp_path, capacity=16, max_lag=2)
  q.put(make_group("now", version=3))
  q.put(make_group("future", version=5))
  q.put(make_group("old", version=0))
  assert _drain(q, 3) == ["now"]  # "old" lags 3 > max_lag: stale
  counts = q.counts()
  assert (counts["ahead"], counts["stale"], counts["ready"]) == (1, 1, 0)
  assert q.refused_ids() == ["future"]
  # A refused group no longer counts as queued: its prompt may be queued again.
  assert not q.contains("future") and q.contains("old")
  q.put(make_group("future", version=3))
  assert _drain(q, 3) == ["future"]


def test_refused_prompts_are_reopened_in_the_pool(tmp_path):
  q = GroupQueue(tmp_path / "queue", capacity=16, max_lag=4)
  pool = TaskPool(tmp_path / "pool")
  pool.add([("t1", {"n": 1}), ("t2", {"n": 2}), ("t3", {"n": 3})])
  for version in (0, 3):  # the old learner had published version 3 before it died
    task_id, _ = pool.lease("actor")
    q.put(make_group(task_id, version))
    pool.complete("actor", task_id)
  q.recover(1)  # the new learner resumes from step 1
  assert q.refused_ids() == ["t2"]
  assert pool.reopen(q.refused_ids(), finished=q.contains) == 1
  assert pool.lease("actor") == ("t2", {"n": 2})  # back at the front, payload intact
  assert pool.reopen(["t1"], finished=q.contains) == 0  # t1's group is still queued
  with pytest.raises(KeyError, match="no lease"):
    pool.release("actor", "t3")
  pool.release("actor", "t2")
  assert pool.lease("other")[0] == "t2"


def test_metrics_rows_of_discarded_steps_are_kept_apart(tmp_path):
  writer = MetricsWriter(tmp_path)
  for step in range(1, 5):
    writer.write(step, {"loss": float(step)})
  writer.close()
  MetricsWriter(tmp_path, resume_step=2).close()  # resumed from the step-2 checkpoint
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [row["step"] for row in rows] == [1, 2]
  kept = [json.loads(line) for line in
          (tmp_path / "metrics.discarded.jsonl").read_text().splitlines()]
  assert [(row["step"], row["loss"], row["discarded_on_resume_from"]) for row in kept] == [
      (3, 3.0, 2), (4, 4.0, 2)]
