"""Kill an actor mid-rollout, then the learner (SIGKILL), restart: nothing lost or repeated."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from c2jax.rl.queue.group_queue import GroupQueue
from c2jax.rl.tasks.task_pool import TaskPool

WORKERS = pathlib.Path(__file__).with_name("queue_workers.py")
REPO = pathlib.Path(__file__).resolve().parents[2]
TOTAL = 12


def _start(*args):
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  return subprocess.Popen([sys.executable, str(WORKERS), *map(str, args)], env=env)


def _wait_for(condition, timeout=60.0):
  deadline = time.monotonic() + timeout
  while not condition():
    assert time.monotonic() < deadline, "timed out waiting for the workers"
    time.sleep(0.02)


def _kill(process):
  os.kill(process.pid, signal.SIGKILL)
  process.wait()


def test_kill_actor_then_learner_and_restart(tmp_path):
  pool = TaskPool(tmp_path / "tasks")
  q = GroupQueue(tmp_path / "queue", 4, 1000)
  tasks = [(f"task-{i:02d}", {"n": i}) for i in range(TOTAL)]
  pool.add(tasks)
  actor_a = _start("actor", tmp_path, "a", 0.2)
  learner_1 = _start("learner", tmp_path, TOTAL, 0.05)
  processes = [actor_a, learner_1]
  try:
    _wait_for(lambda: pool.counts()["done"] >= 3 and pool.counts()["leased"] == 1)
    _kill(actor_a)  # mid-rollout: holding one lease
    pool.requeue("a", finished=q.contains)
    assert pool.counts()["leased"] == 0
    actor_b = _start("actor", tmp_path, "b", 0.02)
    processes.append(actor_b)
    _wait_for(lambda: len(q.trained_steps()) >= 5)
    _kill(learner_1)
    killed_at = max(q.trained_steps())
    ckpt_step = json.loads((tmp_path / "ckpt.json").read_text())["step"]
    learner_2 = _start("learner", tmp_path, TOTAL, 0.0)
    processes.append(learner_2)
    assert learner_2.wait(timeout=90) == 0
    assert actor_b.wait(timeout=30) == 0
  finally:
    for p in processes:
      if p.poll() is None:
        _kill(p)

  history = json.loads((tmp_path / "ckpt.json").read_text())["history"]
  all_ids = sorted(task_id for task_id, _ in tasks)
  assert sorted(history) == all_ids  # every group trained, none twice
  steps = q.trained_steps()
  assert sorted(steps) == list(range(1, TOTAL + 1))
  assert [ids[0] for _, ids in sorted(steps.items())] == history
  assert q.counts() == {"ready": 0, "claimed": 0, "trained": TOTAL, "stale": 0, "ahead": 0}
  assert pool.counts() == {"pending": 0, "leased": 0, "done": TOTAL}
  assert ckpt_step >= 4  # the learner really was restarted from a checkpoint
  # The append-only record keeps the steps the restart discarded, marked as such.
  record = q.history()
  discarded = [row["step"] for row in record if row["discarded"] is not None]
  assert discarded == list(range(ckpt_step + 1, killed_at + 1))
  assert all(row["discarded"] == ckpt_step for row in record if row["discarded"] is not None)
  assert {row["step"]: row["groups"] for row in record if row["discarded"] is None} == steps
