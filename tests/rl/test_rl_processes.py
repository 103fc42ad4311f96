"""`c2jax rl` with two learner processes over jax.distributed (loopback, 2 x 2 fake CPU
devices) matches one process on 4 devices: two RL steps on the same groups give the same
losses and parameters within 1e-5. Process 0 leads (queue, actors, weights, metrics,
eval); process 1 only steps and checkpoints its shards.

Both runs resume from the same step-0 checkpoint with the same two groups waiting in the
queue and an empty task pool (so the actors exit at once): the batches are then the same
whatever the timing of the processes."""

import json
import pathlib
import shutil
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from c2jax import config as configlib
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.env import procgen
from c2jax.env import tasks as tasks_lib
from c2jax.rl import job
from c2jax.rl.learner import runtime as learner_runtime
from c2jax.rl.actors import rollouts
from c2jax.rl.queue.group_store import Group
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import runtime
from tests.rl.rl_testlib import random_segment
from tests.subprocess_checks import child_env

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 2
TOLERANCE = 1e-5
TIMEOUT_S = 600
CONFIG_FILE = """
from c2jax import config as configlib


def get_config(arg=None):
  c = configlib.load_config_file({rl!r}, "test")
  c.data.cache_dir = {cache!r}
  c.data.sources = [{sources!r}]
  c.data.heldout_repositories = ["two"]
  c.data.heldout_fraction = 0.0
  c.data.tokenizer_file = {tokenizer!r}
  c.learner.steps = {steps}
  c.learner.learning_rate = 1e-3
  c.rl.kl.coef = 0.05
  c.agent.temperature = 0.8
  return c
"""


def _write_sources(root: pathlib.Path) -> None:
  for name, text in (("one", "def a(x):\n  return x + 1\n"), ("two", "B = [1, 2]\n")):
    (root / "src" / name).mkdir(parents=True)
    (root / "src" / name / "m.py").write_text(text)
  texts = ["def a(x):\n  return x + 1\n", "B = [1, 2]\n", "Fix the bug in f."] * 20
  tokenizer_lib.train_bpe(texts, 300).save(root / "tokenizer.json")


def _groups(cfg, steps: int = STEPS) -> list[Group]:
  """One group of two rollouts per step (one rollout in two segments)."""
  rng = np.random.default_rng(0)
  info = dict(solved=[True, False], sampled_tokens=[10, 8], total_tokens=[20, 14],
              turns=[1, 2], thinking_tokens=[0, 0])
  return [Group(f"g{i}", 0, np.float32([1, 0]), np.float32([0.5, -0.5]),
                [random_segment(cfg.model, rng, n) for n in (24, 11, 14)],
                np.int32([0, 0, 1]), dict(info))
          for i in range(steps)]


def _prepare_run(workdir: pathlib.Path, cfg, state, heldout, steps: int = STEPS) -> None:
  """A run directory as `c2jax rl` leaves it at step 0, with `steps` groups queued (one
  per step; test_rl_preemption.py reuses it)."""
  dirs = rollouts.RunDirs(workdir)
  dirs.heldout.parent.mkdir(parents=True)
  tasks_lib.save_jsonl(heldout, str(dirs.heldout))
  dirs.pool()
  queue = dirs.queue(cfg)
  queue.capacity = steps
  for group in _groups(cfg, steps):
    queue.put(group)
  saver = checkpoint_lib.Checkpointer(dirs.checkpoints, async_save=False)
  saver.save(0, state, {}, {"config": json.loads(cfg.to_json())}, force=True)
  saver.close()


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def _rl(config_file, workdir, devices, log, *flags) -> subprocess.Popen:
  env = child_env(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  return subprocess.Popen(
      [sys.executable, "-m", "c2jax.cli", "rl", f"--config={config_file}",
       f"--workdir={workdir}", *flags], cwd=REPO, env=env, stdout=log,
      stderr=subprocess.STDOUT)


def _wait(processes, logs) -> None:
  for process, log in zip(processes, logs):
    try:
      process.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
      for other in processes:
        other.kill()
      pytest.fail(f"c2jax rl hung:\n{log.read_text()[-3000:]}")
    assert process.returncode == 0, log.read_text()[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("rl_processes")
  _write_sources(root)
  config_file = root / "rl_config.py"
  config_file.write_text(CONFIG_FILE.format(
      rl=str(REPO / "configs" / "rl.py"), cache=str(root / "cache"),
      sources=f"{root}/src/*", tokenizer=str(root / "tokenizer.json"), steps=STEPS))
  cfg = configlib.load_config_file(config_file)
  job.validate(cfg)
  state = jax.device_get(runtime.init_state(learner_runtime.build(cfg)))
  heldout = [procgen.generate(str(root / "heldout_repos"), 7, 1)]
  for name in ("one", "two"):
    _prepare_run(root / name, cfg, state, heldout)
  port = _free_port()
  logs = [root / "one.log", root / "two.0.log", root / "two.1.log"]
  handles = [open(log, "wb") for log in logs]  # pylint: disable=consider-using-with
  try:
    processes = [_rl(config_file, root / "one", 4, handles[0])]
    processes += [_rl(config_file, root / "two", 2, handles[1 + rank],
                      f"--config.parallel.distributed.coordinator_address=127.0.0.1:{port}",
                      "--config.parallel.distributed.num_processes=2",
                      f"--config.parallel.distributed.process_id={rank}")
                  for rank in range(2)]
    _wait(processes, logs)
  finally:
    for handle in handles:
      handle.close()
  return root, cfg, state, logs


def _losses(workdir: pathlib.Path) -> dict[int, float]:
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {row["step"]: row["loss"] for row in rows if "loss" in row}


def _params(workdir: pathlib.Path, like):
  reader = checkpoint_lib.Checkpointer(workdir / "checkpoints", async_save=False)
  try:
    return reader.steps(), reader.restore_params(STEPS, checkpoint_lib.abstract_like(like))
  finally:
    reader.close()


@pytest.mark.slow  # three `c2jax rl` processes, each compiling the tiny RL step
def test_two_learner_processes_match_one(runs):
  root, _, state, logs = runs
  one, two = _losses(root / "one"), _losses(root / "two")
  assert sorted(one) == [1, 2] and sorted(two) == [1, 2]
  np.testing.assert_allclose([two[s] for s in (1, 2)], [one[s] for s in (1, 2)],
                             atol=TOLERANCE, rtol=0)
  assert one[1] != one[2]  # the steps really update the policy
  steps_one, params_one = _params(root / "one", state.params)
  steps_two, params_two = _params(root / "two", state.params)
  assert steps_one == steps_two == [0, 1, 2]
  diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
             for a, b in zip(jax.tree.leaves(params_one), jax.tree.leaves(params_two)))
  assert diff <= TOLERANCE
  moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
              for a, b in zip(jax.tree.leaves(params_one), jax.tree.leaves(state.params)))
  assert moved > 10 * TOLERANCE
  # Process 0 led (one queue, one publisher, metrics); process 1 only stepped.
  follower = logs[2].read_text().strip().splitlines()[-1]
  assert json.loads(follower) == {"step": STEPS, "process": 1, "preempted": None}
  assert "resuming from step 0 (2 learner processes)" in logs[1].read_text()
  queue = rollouts.RunDirs(root / "two").queue(runs[1])
  assert queue.trained_steps() == {1: ["g0"], 2: ["g1"]}
  weights = root / "two" / "weights"
  [incarnation] = [p for p in weights.iterdir() if p.name.startswith("from-step-")]
  manifests = sorted(p.name for p in (incarnation / "manifests").iterdir())
  assert len(manifests) == STEPS + 1, manifests


@pytest.mark.slow  # one more `c2jax rl` process
def test_a_two_process_learner_checkpoint_resumes_on_one_process_and_another_mesh(
    runs, tmp_path):
  """The 2-process run's step-1 checkpoint, resumed by one process on fsdp=2, expert=2:
  the learner takes the group it trained at step 2 again, and its step-2 loss and
  parameters are the 2-process run's."""
  root, cfg, state, _ = runs
  workdir = tmp_path / "moved"
  shutil.copytree(root / "two", workdir)
  shutil.rmtree(workdir / "checkpoints" / str(STEPS))
  log = tmp_path / "moved.log"
  with open(log, "wb") as handle:
    process = _rl(root / "rl_config.py", workdir, 4, handle,
                  "--config.parallel.mesh.fsdp=2", "--config.parallel.mesh.expert=2")
    _wait([process], [log])
  assert "rl: resuming from step 1" in log.read_text()
  two, moved = _losses(root / "two"), _losses(workdir)
  np.testing.assert_allclose(moved[STEPS], two[STEPS], atol=TOLERANCE, rtol=0)
  _, params_two = _params(root / "two", state.params)
  _, params_moved = _params(workdir, state.params)
  diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
             for a, b in zip(jax.tree.leaves(params_two), jax.tree.leaves(params_moved)))
  assert diff <= TOLERANCE
  assert rollouts.RunDirs(workdir).queue(cfg).trained_steps() == {1: ["g0"], 2: ["g1"]}


@pytest.mark.slow  # two more `c2jax rl` processes
def test_two_learner_processes_on_two_hosts_match_them_on_one(runs, tmp_path):
  """The 2-process learner with each process in a network namespace of its own (two hosts
  joined by a veth pair, tests/netns_testlib.py): the losses of the loopback run."""
  from tests.netns_testlib import Hosts  # pylint: disable=g-import-not-at-top

  root, cfg, state, _ = runs
  workdir = tmp_path / "hosts"
  _prepare_run(workdir, cfg, state, [procgen.generate(str(tmp_path / "heldout"), 7, 1)])
  logs = [tmp_path / f"hosts.{rank}.log" for rank in range(2)]
  with Hosts() as hosts:
    handles = [open(log, "wb") for log in logs]  # pylint: disable=consider-using-with
    try:
      processes = []
      for rank in range(2):
        env = child_env(XLA_FLAGS="--xla_force_host_platform_device_count=2")
        processes.append(subprocess.Popen(
            hosts.command(rank, [
                sys.executable, "-m", "c2jax.cli", "rl", f"--config={root / 'rl_config.py'}",
                f"--workdir={workdir}",
                f"--config.parallel.distributed.coordinator_address={hosts.addresses[0]}:8476",
                "--config.parallel.distributed.num_processes=2",
                f"--config.parallel.distributed.process_id={rank}"]),
            cwd=REPO, env=env, stdout=handles[rank], stderr=subprocess.STDOUT))
      _wait(processes, logs)
    finally:
      for handle in handles:
        handle.close()
  assert sorted(_losses(workdir)) == [1, 2]
  assert _losses(workdir) == _losses(root / "two")
  assert "coordinator " + hosts.addresses[0] in logs[1].read_text()
