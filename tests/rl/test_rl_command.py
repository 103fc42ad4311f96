"""`c2jax rl` end to end at test size: actors in sandboxes, queue, learner, weight sync,
and crash recovery (an actor killed mid-rollout, then the learner killed and restarted)."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from c2jax.rl.queue.group_queue import GroupQueue
from tests.rl import rl_testlib

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 4


def _command(workdir, data_cache):
  return [sys.executable, "-m", "c2jax.cli", "rl", "--config=configs/rl.py:test",
          f"--workdir={workdir}", f"--config.data.cache_dir={data_cache}",
          "--config.data.vocab_size=1024", "--config.data.max_total_bytes=4000000",
          "--config.data.tokenizer_train_bytes=300000", f"--config.learner.steps={STEPS}",
          "--config.rl.curriculum.strength=1.0"]


def _start(workdir, data_cache, log):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.Popen(_command(workdir, data_cache), cwd=REPO, env=env,
                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(condition, what, process=None, timeout=420):
  deadline = time.monotonic() + timeout
  while not condition():
    if process is not None and process.poll() is not None:
      raise AssertionError(f"c2jax rl exited ({process.returncode}) while waiting for {what}")
    if time.monotonic() > deadline:
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.2)


def _leased(workdir):
  leased = pathlib.Path(workdir) / "pool" / "leased"
  return leased.exists() and any(any(d.iterdir()) for d in leased.iterdir())


def _checkpoints(workdir):
  root = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.exists() else []


@pytest.mark.slow
def test_rl_survives_actor_and_learner_kills_without_losing_or_repeating_groups(tmp_path,
                                                                               data_cache):
  workdir = tmp_path / "run"
  log_path = tmp_path / "rl.log"
  with open(log_path, "ab") as log:
    learner = _start(workdir, data_cache, log)
    try:
      # An actor mid-rollout (holding a leased prompt) is killed; the learner gives the
      # prompt back to the pool and restarts the actor.
      _wait_for(lambda: _leased(workdir) and rl_testlib.actor_pids(workdir), "a leased prompt", learner)
      [actor] = rl_testlib.actor_pids(workdir)
      os.kill(actor, signal.SIGKILL)
      # Then the learner itself dies after its second checkpoint.
      _wait_for(lambda: len(_checkpoints(workdir)) >= 2, "two checkpoints", learner)
      os.kill(learner.pid, signal.SIGKILL)
      learner.wait()
      _wait_for(lambda: not rl_testlib.actor_pids(workdir), "the actors to die with the learner",
                timeout=30)
      resumed = _start(workdir, data_cache, log)
      assert resumed.wait(timeout=600) == 0
    finally:
      for pid in rl_testlib.actor_pids(workdir) + ([learner.pid] if learner.poll() is None else []):
        os.kill(pid, signal.SIGKILL)
  output = log_path.read_text(errors="replace")
  # The curriculum probed every prompt once, before the first step, and only then.
  assert output.count("rl: curriculum over 8 prompts") == 1, output[-3000:]
  order = json.loads((workdir / "curriculum.json").read_text())["order"]
  assert len(order) == len(set(order)) == 8
  assert "actor0 died" in output, output[-3000:]
  assert "resuming from step" in output, output[-3000:]

  queue = GroupQueue(workdir / "queue", capacity=1, max_lag=0)
  manifests = queue.trained_steps()
  assert sorted(manifests) == list(range(1, STEPS + 1))
  trained = [group for step in sorted(manifests) for group in manifests[step]]
  assert len(trained) == len(set(trained)) == STEPS  # groups_per_step = 1, never twice
  counts = queue.counts()
  assert counts["trained"] == STEPS and counts["claimed"] == 0
  # Every prompt either trained, waiting, or still in the pool: none lost.
  done = {p.name for p in (workdir / "pool" / "done").iterdir()}
  assert set(trained) <= done
  assert not list((workdir / "pool" / "leased").rglob("*.json"))
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  steps = [row["step"] for row in rows if "loss" in row]
  assert steps == list(range(1, STEPS + 1))  # one row per step, resumed without gaps
  assert all(0.0 <= row["idle_fraction"] <= 1.0 for row in rows if "loss" in row)
  evals = [row for row in rows if "eval/pass_rate" in row]
  assert evals and evals[-1]["step"] == STEPS
