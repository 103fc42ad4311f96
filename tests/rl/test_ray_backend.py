"""`actors.backend = 'ray'` end to end on a local Ray cluster: two actors in Ray worker
processes reach the run only through Ray (leases, repositories, groups, infra counts)
and a file:// URL (weights); the learner checkpoints to another file:// URL. One actor's
worker is killed mid-rollout: its prompt goes back to the pool and the actor restarts."""

import os
import pathlib
import signal
import threading
import time

import pytest

ray = pytest.importorskip(
    "ray", reason="the Ray backend test needs Ray: pip install 'c2jax[ray]' (in .[test])")

from c2jax import config as configlib  # pylint: disable=g-import-not-at-top
from c2jax.rl import trainer  # pylint: disable=g-import-not-at-top
from c2jax.rl.queue.group_queue import GroupQueue  # pylint: disable=g-import-not-at-top
from c2jax.rl.queue.group_store import Group  # pylint: disable=g-import-not-at-top

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 2


@pytest.fixture
def local_ray():
  # Workers import this checkout's c2jax, as the driver does.
  path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
           runtime_env={"env_vars": {"PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}})
  yield
  ray.shutdown()


def _actor_workers() -> list[int]:
  """Pids of Ray worker processes running an actor (Ray titles them ray::run_actor)."""
  pids = []
  for proc in pathlib.Path("/proc").iterdir():
    try:
      if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(b"ray::run_actor"):
        pids.append(int(proc.name))
    except OSError:
      continue
  return pids


def _kill_one_actor_mid_rollout(workdir: pathlib.Path, killed: list, stop: threading.Event):
  leased = workdir / "pool" / "leased"
  while not stop.is_set():
    if leased.exists() and any(leased.rglob("*.json")) and _actor_workers():
      pid = _actor_workers()[0]
      os.kill(pid, signal.SIGKILL)
      killed.append(pid)
      return
    time.sleep(0.1)


@pytest.mark.slow
def test_ray_actors_feed_the_learner_without_a_shared_disk(tmp_path, local_ray, capsys):
  cfg = configlib.load_config_file(str(REPO / "configs/rl.py"), "test")
  cfg.data.cache_dir = str(tmp_path / "data")
  cfg.data.vocab_size = 1024
  cfg.data.max_total_bytes = 4_000_000
  cfg.data.tokenizer_train_bytes = 300_000
  cfg.learner.steps = STEPS
  cfg.actors.backend = "ray"
  cfg.actors.count = 2
  cfg.rl.queue.capacity = 2
  bucket = tmp_path / "bucket"
  cfg.actors.weights_dir = f"file://{bucket}/weights"
  cfg.learner.checkpoint_dir = f"file://{bucket}/ckpt/"
  workdir = tmp_path / "run"

  killed, stop = [], threading.Event()
  killer = threading.Thread(target=_kill_one_actor_mid_rollout, args=(workdir, killed, stop))
  killer.start()
  try:
    summary = trainer.train(cfg, str(workdir))
  finally:
    stop.set()
    killer.join()

  assert summary["step"] == STEPS
  output = capsys.readouterr().out
  assert killed and " died (status 1); " in output and "restart 1/" in output, output[-3000:]
  # Checkpoints and weights went to the URLs, not into the run directory (nor into a
  # directory named 'file:' under the working directory).
  assert str(STEPS) in os.listdir(bucket / "ckpt")
  assert not (workdir / "checkpoints").exists() and not (workdir / "weights").exists()
  assert (bucket / "weights" / "from-step-000000" / "manifests").is_dir()
  assert not list(pathlib.Path.cwd().glob("file:*"))
  # Groups came through the hub into the learner's queue: trained once each, persisted
  # with the step manifests that exactly-once recovery reads.
  queue = GroupQueue(workdir / "queue", capacity=1, max_lag=0)
  manifests = queue.trained_steps()
  assert sorted(manifests) == list(range(1, STEPS + 1))
  trained = [g for step in sorted(manifests) for g in manifests[step]]
  assert len(trained) == len(set(trained)) == STEPS * cfg.learner.groups_per_step
  groups = [Group.from_bytes(p.read_bytes()) for p in (workdir / "queue" / "trained").iterdir()]
  assert {g.info["actor"] for g in groups} <= {"actor0", "actor1"}
  assert all(g.segments and len(g.rewards_G) == cfg.rl.group_size for g in groups)
  # Every leased prompt was completed or returned when the actors stopped.
  assert not list((workdir / "pool" / "leased").rglob("*.json"))
  assert set(trained) <= set(os.listdir(workdir / "pool" / "done"))
