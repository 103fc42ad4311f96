"""RL with Ray actors on two hosts that have their own network (two network namespaces
joined by a veth pair, tests/netns_testlib.py): the Ray head, the learner and one actor on
host 0, a Ray worker node with the other actor on host 1. Mid-rollout host 1's link is cut
(its processes keep running, unreachable, as when a machine drops off the network): Ray's
health checks declare the node dead, the learner names the lost host, returns its actor's
prompt to the pool, restarts the actor on host 0 and finishes with every group trained
exactly once."""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest

pytest.importorskip("ray", reason="the Ray backend test needs Ray: pip install 'c2jax[ray]'")

from c2jax.rl.queue.group_queue import GroupQueue  # pylint: disable=g-import-not-at-top
from tests import ray_testlib  # pylint: disable=g-import-not-at-top
from tests.netns_testlib import Hosts  # pylint: disable=g-import-not-at-top

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 3
PORT = 6390  # the head's GCS, on host 0's own address (each namespace has its own ports)
# Ray's health checks on the head (ms, count): a node that stops answering is declared
# dead after about period x threshold (Ray's defaults: 3 s x 5, each check waiting 10 s).
HEALTH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
          "RAY_health_check_failure_threshold": "3"}
NOTICE_BOUND_S = 60.0  # from the cut to the learner's report of the dead actor


def _ray_node(hosts, host: int, args: list[str], temp: pathlib.Path, log: pathlib.Path,
              env: dict) -> subprocess.Popen:
  command = hosts.command(host, [
      ray_testlib.RAY_CLI, "start", *args, f"--node-ip-address={hosts.addresses[host]}",
      "--num-cpus=1", "--disable-usage-stats", "--block", f"--temp-dir={temp}",
      "--dashboard-agent-listen-port=52365", "--metrics-export-port=8090",
      "--runtime-env-agent-port=52366"])
  with open(log, "a") as out:
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)


def _listening(address: str, port: int, hosts, host: int) -> bool:
  probe = (f"import socket; socket.create_connection(('{address}', {port}), timeout=1)")
  return subprocess.run(hosts.command(host, [sys.executable, "-c", probe]),
                        capture_output=True, check=False).returncode == 0


def _wait(what, ready, timeout, logs):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if ready():
      return
    time.sleep(0.5)
  tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                    for p in logs if p.exists())
  raise TimeoutError(f"{what} not within {timeout:.0f} s\n{tails}")


@pytest.mark.slow
def test_ray_actors_across_hosts_survive_a_host_cut_off_the_network(tmp_path, data_cache):
  env = {**os.environ, **ray_testlib.worker_env(), "RAY_AUTH_MODE": "disabled", **HEALTH}
  # Short: Ray's Unix sockets live under it (~100 characters at most in a socket path).
  temp = pathlib.Path(tempfile.mkdtemp(prefix="rayh", dir="/tmp"))
  workdir, bucket = tmp_path / "run", tmp_path / "bucket"
  logs = [temp / "head.log", temp / "node1.log", tmp_path / "learner.log"]
  lines: list[tuple[float, str]] = []
  with Hosts() as hosts:
    try:
      address = f"{hosts.addresses[0]}:{PORT}"
      _ray_node(hosts, 0, ["--head", f"--port={PORT}", "--include-dashboard=false",
                           '--resources={"host0": 1}'], temp, logs[0], env)
      _wait("the head's GCS", lambda: _listening(hosts.addresses[0], PORT, hosts, 0), 120,
            logs)
      _ray_node(hosts, 1, [f"--address={address}", '--resources={"host1": 1}'],
                temp, logs[1], env)
      _wait("host 1's node joining", lambda: "host1" in subprocess.run(
          hosts.command(0, [ray_testlib.RAY_CLI, "status", f"--address={address}"]),
          capture_output=True, text=True, env=env, check=False).stdout, 300, logs)
      learner = subprocess.Popen(
          hosts.command(0, [
              sys.executable, "-u", "-m", "c2jax.cli", "rl", "--config=configs/rl.py:test",
              f"--workdir={workdir}", f"--config.data.cache_dir={data_cache}",
              "--config.data.vocab_size=1024", "--config.data.max_total_bytes=4000000",
              "--config.data.tokenizer_train_bytes=300000",
              f"--config.learner.steps={STEPS}", "--config.actors.backend=ray",
              "--config.actors.count=2", "--config.rl.queue.capacity=2",
              f"--config.actors.weights_dir=file://{bucket}/weights",
              f"--config.learner.checkpoint_dir=file://{bucket}/ckpt/"]),
          cwd=REPO, env={**env, "RAY_ADDRESS": address}, stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT, text=True)

      def read():
        with open(logs[2], "w") as log:
          for line in learner.stdout:
            lines.append((time.monotonic(), line))
            log.write(line)
            log.flush()
      reader = threading.Thread(target=read, daemon=True)
      reader.start()
      leased = workdir / "pool" / "leased"
      _wait("both actors holding a prompt", lambda: leased.exists() and len(
          list(leased.glob("*/*.json"))) == 2, 600, logs)
      cut_at = time.monotonic()
      hosts.cut(1)
      try:
        learner.wait(timeout=900)
      except subprocess.TimeoutExpired:
        learner.kill()
      reader.join(timeout=10)
    finally:
      shutil.rmtree(temp, ignore_errors=True)  # Hosts ends every process it holds
  output = "".join(line for _, line in lines)
  assert learner.returncode == 0, output[-4000:]
  died = [(t, line) for t, line in lines if " died (status " in line]
  assert died, output[-4000:]
  noticed_at, report = died[0]
  print(f"the learner reported the lost host {noticed_at - cut_at:.1f} s after the cut")
  assert f"on node {hosts.addresses[1]} (lost: Ray declared the node dead)" in report, report
  assert noticed_at - cut_at < NOTICE_BOUND_S, (noticed_at - cut_at, report)
  assert "restart 1/" in report
  queue = GroupQueue(workdir / "queue", capacity=1, max_lag=0)
  manifests = queue.trained_steps()
  assert sorted(manifests) == list(range(1, STEPS + 1))
  trained = [g for step in sorted(manifests) for g in manifests[step]]
  assert len(trained) == len(set(trained))
  assert not list((workdir / "pool" / "leased").rglob("*.json"))
