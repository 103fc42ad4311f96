"""`c2jax rl` with an actor of two JAX processes (config.actors.processes = 2, one CPU
device each; the actor's engine mesh expert=2 spans both): process 0 rolls out, process 1
follows its engine. Killing the follower mid-rollout restarts the actor whole; its leased
prompt goes back to the pool and no group is lost or trained twice; the sampler's log-probs
of an on-policy group are the learner's (mismatch_p99). (2 and 4 processes of
2 devices, with tensor parallelism inside each: tests/rollout/test_engine_processes.py.)"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from c2jax.rl.queue.group_queue import GroupQueue
from tests.rl import rl_testlib
from tests.rl.test_rl_command import REPO, _leased, _wait_for

STEPS = 2


def _process_of(pid: int) -> int:
  environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
  for entry in environ:
    if entry.startswith(b"JAX_PROCESS_ID="):
      return int(entry.split(b"=", 1)[1])
  return -1


@pytest.mark.slow
def test_a_two_process_actor_rolls_out_and_restarts_whole(tmp_path, data_cache):
  workdir = tmp_path / "run"
  command = [sys.executable, "-m", "c2jax.cli", "rl", "--config=configs/rl.py:test",
             f"--workdir={workdir}", f"--config.data.cache_dir={data_cache}",
             "--config.data.vocab_size=1024", "--config.data.max_total_bytes=4000000",
             "--config.data.tokenizer_train_bytes=300000", f"--config.learner.steps={STEPS}",
             "--config.actors.processes=2", "--config.actors.parallel.mesh.expert=2"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  log_path = tmp_path / "rl.log"
  with open(log_path, "ab") as log:
    learner = subprocess.Popen(command, cwd=REPO, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
      def follower():
        pids = rl_testlib.actor_pids(workdir)
        return [pid for pid in pids if _process_of(pid) == 1] if len(pids) == 2 else []
      _wait_for(lambda: _leased(workdir) and follower(), "a leased prompt", learner)
      os.kill(follower()[0], signal.SIGKILL)
      assert learner.wait(timeout=600) == 0
    finally:
      for pid in rl_testlib.actor_pids(workdir) + ([learner.pid] if learner.poll() is None
                                                   else []):
        os.kill(pid, signal.SIGKILL)
  output = log_path.read_text(errors="replace")
  assert "actor0 died (status -9) (process 1 of 2 ended first)" in output, output[-3000:]
  # Process 1 started twice, each time in a jax.distributed job of its own (the kill may
  # land before the first one built its engine); the second followed process 0's engine.
  follower_log = (workdir / "actors" / "actor0.p1.log").read_text(errors="replace")
  assert follower_log.count("distributed: process 1 of 2, coordinator") == 2, follower_log
  restarted = follower_log.split("distributed: process 1 of 2, coordinator")[-1]
  assert "actor0: process 1 of 2 follows process 0's engine" in restarted, follower_log
  queue = GroupQueue(workdir / "queue", capacity=1, max_lag=0)
  manifests = queue.trained_steps()
  assert sorted(manifests) == list(range(1, STEPS + 1))
  trained = [group for step in sorted(manifests) for group in manifests[step]]
  assert len(trained) == len(set(trained)) == STEPS  # never twice
  assert not list((workdir / "pool" / "leased").rglob("*.json"))  # none held
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [row["step"] for row in rows if "loss" in row] == list(range(1, STEPS + 1))
  # Step 1 trains a group sampled by version 0, the weights the learner steps from: the
  # gap between the two-process engine's log-probs and the learner's is numerics alone.
  first = next(row for row in rows if row["step"] == 1 and "loss" in row)
  assert first["staleness_tokens"] == 0.0, first
  assert first["mismatch_p99"] < 1e-5, first
