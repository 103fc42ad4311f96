"""Multi-host pretraining over a real network interface: two network namespaces joined
by a veth pair (tests/netns_testlib.py), one `c2jax pretrain` process in each, the
coordinator at host 0's address. Its losses are those of the same two processes over
loopback: gloo listens on the address that reaches the coordinator, not on what the
machine's hostname resolves to (127.0.0.1 here, which the other host cannot reach)."""

import subprocess
import time

import pytest

from c2jax.parallel import distributed
from distributed_testlib import ARGS, PRETRAIN, finish, pair_env, start_pair
from tests.netns_testlib import Hosts
from train_testlib import REPO, job_command, losses

pytestmark = pytest.mark.slow  # two JAX processes


def test_two_hosts_train_as_two_processes_on_one(tmp_path, data_cache, two_process_reference):
  workdir = tmp_path / "run"
  with Hosts() as hosts:
    coordinator = f"{hosts.addresses[0]}:8476"
    procs = [subprocess.Popen(
        hosts.command(rank, job_command("pretrain", PRETRAIN, workdir, data_cache, *ARGS)),
        cwd=REPO, env=pair_env(JAX_COORDINATOR_ADDRESS=coordinator, JAX_NUM_PROCESSES=2,
                               JAX_PROCESS_ID=rank),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    results = finish(procs, timeout_s=300)
  assert all(f"coordinator {coordinator}" in out for _, out, _ in results)
  assert losses(workdir) == losses(two_process_reference)
  assert losses(workdir / "process_1") == losses(two_process_reference / "process_1")


PEER_TIMEOUT_S = 8


def _checkpoints(workdir) -> list[int]:
  folder = workdir / "checkpoints"
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def test_a_host_cut_off_the_network_is_named_and_the_job_resumes(tmp_path, data_cache,
                                                                 two_process_reference):
  """Host 1's link is cut after a checkpoint: each process names the other's host within
  the bound and stops with PEER_LOST_EXIT (no collective can finish, so the step in
  flight cannot be saved); rerun, on loopback this time, the job resumes from the last
  checkpoint with the uninterrupted run's losses."""
  workdir = tmp_path / "run"
  extra = ("--config.train.checkpoint_every=2",
           f"--config.parallel.distributed.peer_timeout_s={PEER_TIMEOUT_S}")
  with Hosts() as hosts:
    coordinator = f"{hosts.addresses[0]}:8476"
    procs = [subprocess.Popen(
        hosts.command(rank, job_command("pretrain", PRETRAIN, workdir, data_cache, *ARGS,
                                        *extra)),
        cwd=REPO, env=pair_env(JAX_COORDINATOR_ADDRESS=coordinator, JAX_NUM_PROCESSES=2,
                               JAX_PROCESS_ID=rank),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    deadline = time.monotonic() + 300
    while not _checkpoints(workdir) and time.monotonic() < deadline:
      assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
      time.sleep(0.05)
    cut_at = time.monotonic()
    hosts.cut(1)
    results = [p.communicate(timeout=120) for p in procs]
    stopped_after = time.monotonic() - cut_at
  assert [p.returncode for p in procs] == [distributed.PEER_LOST_EXIT] * 2, results
  out0, out1 = (out for out, _ in results)
  print(f"both stopped {stopped_after:.1f} s after the cut:",
        *(line for out in (out0, out1) for line in out.splitlines() if "lost process" in line))
  assert f"lost process 1 at {hosts.addresses[1]}: no answer for {PEER_TIMEOUT_S} s" in out0
  assert f"lost process 0 at {hosts.addresses[0]}" in out1
  assert "The last checkpoint is step" in out0 and "rerun the same command" in out0
  assert stopped_after < PEER_TIMEOUT_S + 30, stopped_after
  saved = _checkpoints(workdir)
  assert saved and max(saved) < 14
  finish(start_pair(workdir, data_cache, "--config.train.checkpoint_every=2"))
  assert losses(workdir) == losses(two_process_reference)
