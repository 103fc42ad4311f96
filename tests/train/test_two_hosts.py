"""Multi-host pretraining over a real network interface: two network namespaces joined
by a veth pair (tests/netns_testlib.py), one `c2jax pretrain` process in each, the
coordinator at host 0's address. Its losses are those of the same two processes over
loopback: gloo listens on the address that reaches the coordinator, not on what the
machine's hostname resolves to (127.0.0.1 here, which the other host cannot reach)."""

import subprocess

import pytest

from distributed_testlib import ARGS, PRETRAIN, finish, pair_env
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
