"""Preemption of a 2-process jax.distributed pretraining run (2 CPU processes x 2 fake
devices): SIGTERM to one process at a random step stops both after the same step with one
checkpoint and exit status 0, and rerunning both continues the uninterrupted run's losses
exactly."""

import random
import signal
import socket
import subprocess

import pytest

from tests.subprocess_checks import child_env
from train_testlib import REPO, job_command, losses, signal_at_step, summary

pytestmark = pytest.mark.slow  # each run starts two JAX processes
PRETRAIN = "configs/pretrain.py:tiny"
# Enough steps after the latest signal (step 5) for the processes to agree on a sync
# point (a step or two after it): a tiny step takes tens of milliseconds on a quiet machine.
STEPS = 30
# The tiny model cut to its one MoE layer: six processes compile it, and each step is a
# collective between the two.
ARGS = (f"--config.train.steps={STEPS}", "--config.train.checkpoint_every=20",
        "--config.train.eval_every=0", "--config.model.num_layers=1",
        "--config.model.first_k_dense=0")


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def _start_pair(workdir, data_cache) -> list[subprocess.Popen]:
  port = _free_port()
  return [subprocess.Popen(
      job_command("pretrain", PRETRAIN, workdir, data_cache, *ARGS), cwd=REPO,
      # No compilation cache, as the other jax.distributed tests: JAX writes it from process
      # 0 only, so with it process 0 loads while process 1 compiles, and under load the
      # first collective's Gloo rendezvous times out (30 s) waiting for process 1.
      env=child_env(C2JAX_XLA_CACHE="off",
                    XLA_FLAGS="--xla_force_host_platform_device_count=2",
                    JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=2,
                    JAX_PROCESS_ID=rank),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]


def _finish(procs, timeout_s=600) -> list[tuple[int, str, str]]:
  results = []
  for proc in procs:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err[-4000:]
    results.append((proc.returncode, out, err))
  return results


def test_sigterm_to_one_process_stops_both_at_one_step_and_resumes_exactly(
    tmp_path, data_cache):
  reference = tmp_path / "reference"
  _finish(_start_pair(reference, data_cache))
  workdir = tmp_path / "preempted"
  pair = _start_pair(workdir, data_cache)
  at_step = random.randint(1, 5)
  results = signal_at_step(pair, workdir, at_step, signal.SIGTERM, to=[pair[1]],
                           timeout_s=600)
  for rank, (code, _, err) in enumerate(results):
    assert code == 0, f"process {rank}, signalled at step {at_step}:\n{err[-3000:]}"
  stopped = [summary(out)["preempted"] for _, out, _ in results]
  # JAX's preemption sync point: both stop after the same step, after the signal.
  assert stopped[0] == stopped[1] and at_step < stopped[0] < STEPS, (at_step, stopped)
  assert (workdir / "checkpoints" / str(stopped[0])).is_dir()
  resumed = _finish(_start_pair(workdir, data_cache))
  assert all(f"resume: step {stopped[0]}" in out for _, out, _ in resumed)
  assert losses(workdir) == losses(reference)
  assert losses(workdir / "process_1") == losses(reference / "process_1")
