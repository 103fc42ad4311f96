"""Actor and learner processes for test_queue_crash.py (run as a script, then SIGKILLed).

  python queue_workers.py actor ROOT ACTOR_ID ROLLOUT_S
  python queue_workers.py learner ROOT TOTAL STEP_S
The learner's "parameters" are the list of group ids it trained on, checkpointed
atomically every 2 steps, so the test can check that the surviving history trains every
group exactly once.
"""

import json
import pathlib
import sys
import time

import numpy as np

from c2jax.rl.queue.group_queue import GroupQueue
from c2jax.rl.queue.group_store import Group, atomic_write
from c2jax.rl.tasks.task_pool import TaskPool


def actor(root, actor_id, rollout_s):
  pool, q = TaskPool(root / "tasks"), GroupQueue(root / "queue", 4, 1000, poll_s=0.01)
  while (task := pool.lease(actor_id)) is not None:
    task_id, payload = task
    time.sleep(rollout_s)  # the rollout; a kill here loses only this task
    tokens = np.full(3, payload["n"], np.int32)
    q.put(Group(task_id, 0, np.ones(2), np.zeros(2), [{"tokens": tokens}] * 2,
                np.arange(2)))
    pool.complete(actor_id, task_id)


def learner(root, total, step_s):
  q = GroupQueue(root / "queue", 4, 1000, poll_s=0.01)
  ckpt = root / "ckpt.json"
  state = json.loads(ckpt.read_text()) if ckpt.exists() else {"step": 0, "history": []}
  q.recover(state["step"])
  step, history = state["step"], list(state["history"])
  while len(history) < total:
    group = q.get(step, timeout=60)
    step += 1
    time.sleep(step_s)  # the train step
    history.append(group.group_id)
    q.mark_trained([group.group_id], step)
    if step % 2 == 0 or len(history) == total:
      atomic_write(ckpt, json.dumps({"step": step, "history": history}).encode())


if __name__ == "__main__":
  role, root = sys.argv[1], pathlib.Path(sys.argv[2])
  if role == "actor":
    actor(root, sys.argv[3], float(sys.argv[4]))
  else:
    learner(root, int(sys.argv[3]), float(sys.argv[4]))
