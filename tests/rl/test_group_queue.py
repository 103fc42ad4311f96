"""GroupQueue and TaskPool: order, back-pressure, staleness, threads, crash recovery."""

import queue
import threading
import time

import numpy as np
import pytest

from c2jax.rl.queue.group_queue import GroupQueue
from c2jax.rl.queue.group_store import Group
from c2jax.rl.tasks.task_pool import TaskPool


def make_group(group_id, version=0, chains=2):
  segments = [{"tokens": np.arange(n, dtype=np.int32) + 10 * c,
               "sampler_logprobs": -np.linspace(0.1, 1.0, n).astype(np.float32),
               "router_indices": np.full((n, 2, 3), c, np.int32)}
              for c, n in enumerate(range(3, 3 + chains))]
  return Group(group_id, version, np.arange(chains, dtype=np.float32),
               np.arange(chains, dtype=np.float32) - 0.5, segments,
               np.arange(chains, dtype=np.int32))


def test_group_bytes_round_trip():
  group = make_group("task-7", version=4, chains=3)
  back = Group.from_bytes(group.to_bytes())
  assert (back.group_id, back.policy_version) == ("task-7", 4)
  np.testing.assert_array_equal(back.advantages_G, group.advantages_G)
  np.testing.assert_array_equal(back.segment_chain_S, group.segment_chain_S)
  for a, b in zip(back.segments, group.segments):
    assert a.keys() == b.keys()
    for key in a:
      assert a[key].dtype == b[key].dtype
      np.testing.assert_array_equal(a[key], b[key])


def test_bad_ids_and_mismatched_segments_are_rejected():
  with pytest.raises(ValueError, match="group_id"):
    make_group("../escape")
  with pytest.raises(ValueError, match="segment_chain_S"):
    Group("g", 0, np.zeros(1), np.zeros(1), [{"tokens": np.zeros(2)}], np.zeros(2))


def test_fifo_back_pressure_and_single_put(tmp_path):
  q = GroupQueue(tmp_path, capacity=2, max_lag=5, poll_s=0.005)
  q.put(make_group("a"))
  q.put(make_group("b"))
  with pytest.raises(queue.Full):
    q.put(make_group("c"), timeout=0.05)
  blocked = threading.Thread(target=q.put, args=(make_group("c"),))
  blocked.start()
  time.sleep(0.1)
  assert blocked.is_alive()  # still waiting for room
  assert q.get(learner_version=0).group_id == "a"
  blocked.join(timeout=5)
  assert not blocked.is_alive()
  assert [q.get(0).group_id for _ in range(2)] == ["b", "c"]
  with pytest.raises(ValueError, match="single epoch"):
    q.put(make_group("a"))
  with pytest.raises(queue.Empty):
    q.get(0, timeout=0.02)


def test_stale_groups_are_dropped(tmp_path):
  q = GroupQueue(tmp_path, capacity=8, max_lag=2)
  for name, version in [("old", 0), ("edge", 3), ("new", 5)]:
    q.put(make_group(name, version))
  assert q.get(learner_version=5).group_id == "edge"  # lag 2 is allowed, lag 5 is not
  assert q.counts() == {"ready": 1, "claimed": 1, "trained": 0, "stale": 1, "ahead": 0}
  assert q.contains("old") and not q.contains("other")


def test_threads_deliver_every_group_exactly_once(tmp_path):
  q = GroupQueue(tmp_path, capacity=3, max_lag=100, poll_s=0.002)
  received, lock = [], threading.Lock()

  def produce(p):
    for i in range(8):
      q.put(make_group(f"p{p}-{i}", chains=1))

  def consume():
    while True:
      try:
        group = q.get(0, timeout=1.0)
      except queue.Empty:
        return
      with lock:
        received.append(group.group_id)

  threads = [threading.Thread(target=produce, args=(p,)) for p in range(4)]
  threads += [threading.Thread(target=consume) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=30)
  assert sorted(received) == sorted(f"p{p}-{i}" for p in range(4) for i in range(8))


def test_recover_requeues_groups_trained_after_the_checkpoint(tmp_path):
  q = GroupQueue(tmp_path, capacity=8, max_lag=100)
  for name in "abcd":
    q.put(make_group(name))
  for step in (1, 2, 3):
    q.mark_trained([q.get(step).group_id], step)
  assert q.get(4).group_id == "d"  # claimed, never trained
  with pytest.raises(ValueError, match="not handed out"):
    q.mark_trained(["a"], 4)
  # Resume from the checkpoint of step 1: b, c and d were not in its parameters.
  assert GroupQueue(tmp_path, 8, 100).recover(checkpoint_step=1) == 3
  assert q.trained_steps() == {1: ["a"]}
  assert [q.get(2).group_id for _ in range(3)] == ["b", "c", "d"]


def test_task_pool_lease_complete_and_requeue(tmp_path):
  pool = TaskPool(tmp_path / "tasks")
  q = GroupQueue(tmp_path / "queue", capacity=8, max_lag=100)
  assert pool.add([("t0", {"prompt": "x"}), ("t1", {}), ("t2", {})]) == 3
  assert pool.add([("t1", {}), ("t3", {})]) == 1  # t1 is known: single epoch
  assert pool.lease("actor-a") == ("t0", {"prompt": "x"})
  assert pool.lease("actor-a")[0] == "t1"
  assert pool.lease("actor-b")[0] == "t2"
  pool.complete("actor-b", "t2")
  with pytest.raises(KeyError):
    pool.complete("actor-b", "t0")
  q.put(make_group("t1"))  # actor-a queued t1's group, then died before complete()
  assert pool.requeue("actor-a", finished=q.contains) == 1
  assert pool.counts() == {"pending": 2, "leased": 0, "done": 2}
  assert [pool.lease("actor-c")[0] for _ in range(2)] == ["t0", "t3"]
  assert pool.lease("actor-c") is None
