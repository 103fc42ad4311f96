"""`actors.backend = 'ray'` end to end on a Ray cluster of two nodes on this machine
(tests/ray_testlib.py): two actors, one on each node, reach the run only through Ray
(leases, repositories, groups, infra counts) and a file:// URL (weights); the learner
checkpoints to another file:// URL. The second node is lost while both actors are
mid-rollout (its raylet and workers killed): its actor's prompt goes back to the pool, the
actor is restarted, and the run finishes with every group trained exactly once."""

import functools
import os
import pathlib
import re
import threading
import time

import pytest

ray = pytest.importorskip(
    "ray", reason="the Ray backend test needs Ray: pip install 'c2jax[ray]' (in .[test])")

from c2jax import config as configlib  # pylint: disable=g-import-not-at-top
from c2jax.rl import trainer  # pylint: disable=g-import-not-at-top
from c2jax.rl.queue.group_queue import GroupQueue  # pylint: disable=g-import-not-at-top
from c2jax.rl.queue.group_store import Group  # pylint: disable=g-import-not-at-top
from tests import ray_testlib  # pylint: disable=g-import-not-at-top

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 2


@pytest.fixture
def two_nodes(monkeypatch):
  """A head and a second node of one CPU each: each runs one actor (1 CPU apiece)."""
  with ray_testlib.two_nodes(monkeypatch, head_cpus=1, node_cpus=1) as nodes:
    yield nodes


def train_during(cfg, workdir: pathlib.Path, fault) -> tuple[dict, list]:
  """trainer.train(cfg, workdir) with `fault(workdir, fired, stop)` on a thread beside it
  (it appends to `fired` when it strikes; `stop` is set once training ends): the run's
  summary and `fired`."""
  fired, stop = [], threading.Event()
  thread = threading.Thread(target=fault, args=(workdir, fired, stop))
  thread.start()
  try:
    summary = trainer.train(cfg, str(workdir))
  finally:
    stop.set()
    thread.join()
  return summary, fired


def _lose_node2_mid_rollout(nodes, workdir: pathlib.Path, lost: list, stop: threading.Event):
  """Removes the second node once it runs an actor and both actors hold a lease."""
  leased = workdir / "pool" / "leased"
  while not stop.is_set():
    if (ray_testlib.busy_cpus(nodes.node2_id, 1) and leased.exists()
        and len(list(leased.glob("*/*.json"))) == 2):
      nodes.lose_node2()
      lost.append(time.time())
      return
    time.sleep(0.1)


def ray_config(data_cache: pathlib.Path):
  """configs/rl.py:test on the Ray backend, STEPS steps, a small corpus in data_cache."""
  cfg = configlib.load_config_file(str(REPO / "configs/rl.py"), "test")
  cfg.data.cache_dir = str(data_cache)
  cfg.data.vocab_size = 1024
  cfg.data.max_total_bytes = 4_000_000
  cfg.data.tokenizer_train_bytes = 300_000
  cfg.learner.steps = STEPS
  cfg.actors.backend = "ray"
  return cfg


def trained_once(workdir: pathlib.Path, cfg) -> list[str]:
  """The groups the learner trained: every step's, each once, none still leased."""
  queue = GroupQueue(workdir / "queue", capacity=1, max_lag=0)
  manifests = queue.trained_steps()
  assert sorted(manifests) == list(range(1, STEPS + 1))
  trained = [g for step in sorted(manifests) for g in manifests[step]]
  assert len(trained) == len(set(trained)) == STEPS * cfg.learner.groups_per_step
  # Every leased prompt was completed or returned when the actors stopped.
  assert not list((workdir / "pool" / "leased").rglob("*.json"))
  return trained


@pytest.mark.slow
def test_ray_actors_on_two_nodes_feed_the_learner_and_survive_losing_one(tmp_path, data_cache,
                                                                        two_nodes,
                                                                        capsys):
  cfg = ray_config(data_cache)
  cfg.actors.count = 2
  cfg.rl.queue.capacity = 2
  bucket = tmp_path / "bucket"
  cfg.actors.weights_dir = f"file://{bucket}/weights"
  cfg.learner.checkpoint_dir = f"file://{bucket}/ckpt/"
  workdir = tmp_path / "run"

  summary, lost = train_during(cfg, workdir, functools.partial(_lose_node2_mid_rollout,
                                                               two_nodes))
  assert summary["step"] == STEPS
  output = capsys.readouterr().out
  assert lost, "the second node never ran an actor mid-rollout"
  # The learner names the node the actor's task ran on (its raylet killed: the task fails).
  assert re.search(r" died \(status 1\) on node \S+; .*restart 1/", output), output[-3000:]
  assert ray_testlib.wait_for_alive_nodes(1) == 1
  # Checkpoints and weights went to the URLs, not into the run directory (nor into a
  # directory named 'file:' under the working directory).
  assert str(STEPS) in os.listdir(bucket / "ckpt")
  assert not (workdir / "checkpoints").exists() and not (workdir / "weights").exists()
  assert (bucket / "weights" / "from-step-000000" / "manifests").is_dir()
  assert not list(pathlib.Path.cwd().glob("file:*"))
  # Groups came through the hub into the learner's queue: trained once each, persisted
  # with the step manifests that exactly-once recovery reads.
  trained = trained_once(workdir, cfg)
  groups = [Group.from_bytes(p.read_bytes()) for p in (workdir / "queue" / "trained").iterdir()]
  assert {g.info["actor"] for g in groups} <= {"actor0", "actor1"}
  assert all(g.segments and len(g.rewards_G) == cfg.rl.group_size for g in groups)
  assert set(trained) <= set(os.listdir(workdir / "pool" / "done"))
