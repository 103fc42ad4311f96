"""`c2jax rl` under faults, on the deterministic setup of test_rl_processes.py (a step-0
checkpoint with one group per step waiting in the queue):
  - SIGTERM at a random step: the learner checkpoints that step, exits 0, and rerunning it
    continues the uninterrupted run's losses exactly;
  - an actor killed while the queue is full (the learner never waits for groups) is
    noticed and restarted within config.actors.check_every_s, its prompt back in the pool.
"""

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import jax
import pytest

from c2jax import config as configlib
from c2jax.env import procgen
from c2jax.rl import job
from c2jax.rl.actors import rollouts
from c2jax.rl.learner import runtime as learner_runtime
from c2jax.train import runtime
from tests.rl import test_rl_processes as setup
from tests.rl import rl_testlib
from tests.subprocess_checks import child_env

pytestmark = pytest.mark.slow  # `c2jax rl` processes compile the tiny RL step
REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 4
CHECK_EVERY_S = 1.0


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  root = tmp_path_factory.mktemp("rl_preemption")
  setup._write_sources(root)  # pylint: disable=protected-access
  config_file = root / "rl_config.py"
  config_file.write_text(setup.CONFIG_FILE.format(
      rl=str(REPO / "configs" / "rl.py"), cache=str(root / "cache"),
      sources=f"{root}/src/*", tokenizer=str(root / "tokenizer.json"), steps=STEPS
  ).replace("  return c\n", f"  c.learner.checkpoint_every = {STEPS}\n"
            f"  c.rl.queue.max_lag = {STEPS}\n"
            f"  c.actors.check_every_s = {CHECK_EVERY_S}\n  return c\n"))
  cfg = configlib.load_config_file(config_file)
  job.validate(cfg)
  state = jax.device_get(runtime.init_state(learner_runtime.build(cfg)))
  heldout = [procgen.generate(str(root / "heldout_repos"), 7, 1)]

  def prepare(name):
    """A run directory at step 0 (checkpoint, held-out task) with STEPS groups queued."""
    setup._prepare_run(root / name, cfg, state, heldout, STEPS)  # pylint: disable=protected-access
    return root / name

  return root, config_file, prepare


def _rl(config_file, workdir, log, *flags) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, "-m", "c2jax.cli", "rl", f"--config={config_file}",
       f"--workdir={workdir}", *flags], cwd=REPO, env=child_env(), stdout=log,
      stderr=subprocess.STDOUT)


def _losses(workdir) -> dict[int, float]:
  return setup._losses(workdir)  # pylint: disable=protected-access


def _wait_for(condition, what, process, timeout_s=420):
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert process.poll() is None, f"c2jax rl exited ({process.returncode}) before {what}"
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.05)


def test_sigterm_checkpoints_the_step_and_the_rerun_continues_exactly(prepared):
  root, config_file, prepare = prepared
  reference, preempted = prepare("reference"), prepare("preempted")
  with open(root / "reference.log", "wb") as log:
    assert _rl(config_file, reference, log).wait(timeout=600) == 0
  at_step = random.randint(1, STEPS - 2)
  log_path = root / "preempted.log"
  with open(log_path, "wb") as log:
    learner = _rl(config_file, preempted, log)
    try:
      _wait_for(lambda: max(_losses(preempted), default=0) >= at_step
                if (preempted / "metrics.jsonl").exists() else False,
                f"step {at_step}", learner)
      learner.send_signal(signal.SIGTERM)
      assert learner.wait(timeout=300) == 0, log_path.read_text()[-3000:]
    finally:
      if learner.poll() is None:
        learner.kill()
  output = log_path.read_text()
  stopped = json.loads(output.strip().splitlines()[-1])["preempted"]
  assert stopped is not None and at_step <= stopped < STEPS, output[-3000:]
  assert (preempted / "checkpoints" / str(stopped)).is_dir()  # not a checkpoint_every step
  with open(log_path, "ab") as log:
    assert _rl(config_file, preempted, log).wait(timeout=600) == 0
  assert f"rl: resuming from step {stopped}" in log_path.read_text()
  assert _losses(preempted) == _losses(reference)
  assert sorted(_losses(reference)) == list(range(1, STEPS + 1))


def _actor_pid(workdir):
  pids = rl_testlib.actor_pids(workdir)
  return pids[0] if pids else None


def test_an_actor_killed_while_the_queue_is_full_is_restarted_within_the_bound(prepared):
  root, config_file, prepare = prepared
  workdir = prepare("actor_killed")
  task = procgen.generate(str(root / "train_repos"), 3, 1)
  rollouts.RunDirs(workdir).pool().add([(task.id, {"task": task.to_json()})])
  log_path = root / "actor_killed.log"
  with open(log_path, "wb") as log:
    # Room for the prompt of a procgen task in this test's small-vocabulary tokenizer.
    learner = _rl(config_file, workdir, log, "--config.actors.max_length=1024")
    try:
      _wait_for(lambda: _actor_pid(workdir), "the actor", learner)
      first = _actor_pid(workdir)
      queue = rollouts.RunDirs(workdir).queue(configlib.load_config_file(config_file))
      assert queue.counts()["ready"] >= 1  # groups waiting: the learner is not waiting
      os.kill(first, signal.SIGKILL)
      killed = time.monotonic()
      _wait_for(lambda: "actor0 died" in log_path.read_text(), "the restart", learner)
      noticed = time.monotonic() - killed
      assert learner.wait(timeout=600) == 0, log_path.read_text()[-3000:]
    finally:
      if learner.poll() is None:
        learner.kill()
      pid = _actor_pid(workdir)
      if pid is not None:
        os.kill(pid, signal.SIGKILL)
  # check_every_s plus the scheduling slack of a loaded 2-core machine.
  assert noticed < CHECK_EVERY_S + 5.0, noticed
  output = log_path.read_text()
  assert "actor0 died (status -9)" in output and "restart 1/" in output, output[-3000:]
  # Its lease went back to the pool (and the stopped actors' leases at the end).
  assert not list((workdir / "pool" / "leased").rglob("*.json"))
