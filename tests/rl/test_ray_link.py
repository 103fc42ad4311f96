"""c2jax.rl.actors.ray_link without a Ray cluster: the hub's methods called through the same
proxies the Ray actors use (a direct stand-in for ray.get / .remote), against a real
run directory."""

import types

import numpy as np
import pytest

from c2jax.rl.actors import infra
from c2jax.rl.actors import ray_link
from c2jax.rl.actors import rollouts
from c2jax.rl.queue.group_store import Group


class _Direct:
  """hub.method.remote(*args) runs at once; ray.get returns the value."""

  def __init__(self, hub):
    self._hub = hub

  def __getattr__(self, name):
    return types.SimpleNamespace(remote=getattr(self._hub, name))


_FAKE_RAY = types.SimpleNamespace(get=lambda value: value)


def _cfg():
  import ml_collections  # pylint: disable=g-import-not-at-top

  return ml_collections.ConfigDict({"rl": {"queue": {"capacity": 1, "max_lag": 1,
                                                     "poll_s": 0.01}}})


def _group(task_id):
  segment = {"tokens": np.arange(4, dtype=np.int32), "loss_mask": np.ones(4, np.int32)}
  return Group(task_id, 0, np.zeros(1), np.zeros(1), [segment], np.zeros(1, np.int64),
               {"actor": "a0"})


@pytest.fixture
def link(tmp_path):
  dirs = rollouts.RunDirs(tmp_path / "run")
  repo = dirs.repos / "t0"
  (repo / "pkg").mkdir(parents=True)
  (repo / "pkg" / "mod.py").write_text("x = 1\n")
  dirs.actors.mkdir(parents=True)
  cfg = _cfg()
  dirs.pool().add([("t0", {"task": {"repo": str(repo)}}),
                   ("t1", {"task": {"repo": str(repo)}})])
  hub = _Direct(ray_link.RunHub(str(dirs.root), cfg.to_json()))
  monkey = pytest.MonkeyPatch()
  monkey.setattr(ray_link, "_PUT_WAIT_S", 0.05)
  yield dirs, cfg, hub
  monkey.undo()


def test_leases_groups_and_infra_counts_reach_the_learners_disk(link):
  dirs, cfg, hub = link
  pool, queue = ray_link.RemotePool(_FAKE_RAY, hub), ray_link.RemoteQueue(_FAKE_RAY, hub)
  task_id, payload = pool.lease("a0")
  assert task_id == "t0" and pool.counts()["leased"] == 1
  queue.put(_group(task_id))
  pool.complete("a0", task_id)
  local_queue = dirs.queue(cfg)
  assert local_queue.contains("t0") and local_queue.counts()["ready"] == 1
  assert local_queue.get(0).group_id == "t0"
  # An infra failure: the prompt goes back through the hub, counts land in actors/.
  task_id, _ = pool.lease("a0")
  run = ray_link.RemoteRun(_FAKE_RAY, hub)
  assert infra.drop_group(types.SimpleNamespace(prompt_returns=1), run, pool, "a0", task_id,
                          retries=2)
  assert infra.totals(dirs) == {"infra_failures": 1, "infra_retries": 2, "infra_dropped": 0}
  assert dirs.pool().counts() == {"pending": 1, "leased": 0, "done": 1}
  del payload


def test_a_full_queue_holds_the_actor_until_the_learner_takes_a_group(link):
  dirs, cfg, hub = link
  queue = ray_link.RemoteQueue(_FAKE_RAY, hub)
  queue.put(_group("t0"))
  import threading  # pylint: disable=g-import-not-at-top

  second = threading.Thread(target=queue.put, args=(_group("t1"),))
  second.start()
  second.join(0.3)
  assert second.is_alive()  # capacity 1: back-pressure
  dirs.queue(cfg).get(0)
  second.join(5)
  assert not second.is_alive() and dirs.queue(cfg).contains("t1")


def test_repositories_are_copied_to_the_actors_scratch_and_nothing_else(link, tmp_path):
  dirs, _, hub = link
  repos = ray_link.RepoCache(_FAKE_RAY, hub, "a0")
  payload = repos.localize({"task": {"repo": str(dirs.repos / "t0"), "id": "t0"}})
  local = payload["task"]["repo"]
  assert local.startswith(str(repos.root))
  assert open(f"{local}/pkg/mod.py").read() == "x = 1\n"
  repos.forget(payload)
  outside = tmp_path / "secret"
  outside.mkdir()
  with pytest.raises(ValueError, match="not a task repository of this run"):
    repos.localize({"task": {"repo": str(outside)}})
  repos.close()
  assert not repos.root.exists()
