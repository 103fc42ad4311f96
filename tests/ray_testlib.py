"""A Ray cluster of two nodes on this machine for the Ray tests (sweeps, RL actors), brought
up as a user brings one up: `ray start --head` and a second `ray start --address=...`,
each its own raylet with its own CPUs, so that tasks really land on either and the second
node can be lost mid-run (its processes killed at once, as when a machine dies).

Both run with `--block` in their own process groups, so the test owns them: stopping the
cluster, or losing the second node, kills those groups and nothing else (`ray stop` would
stop every Ray on the machine, other tests' included). The cluster keeps its session files
in its own temporary directory, and runs without Ray's token authentication
(RAY_AUTH_MODE=disabled): a throwaway cluster on one machine, whose CLI-started nodes and
test driver would otherwise have to share a token file."""

import contextlib
import dataclasses
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
RAY_CLI = os.path.join(os.path.dirname(sys.executable), "ray")
NODE_STARTS = 3  # tries of the second node's `ray start`


def worker_env() -> dict[str, str]:
  """What Ray's workers need: this checkout's c2jax, CPU JAX, and Ray's memory monitor off
  (on a shared test machine it kills small workers for other processes' memory)."""
  path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
  return {"PYTHONPATH": path, "JAX_PLATFORMS": "cpu", "RAY_memory_monitor_refresh_ms": "0"}


# Ports this process has handed out: a port is free again the moment its probe socket
# closes, so two calls could return the same one (a head's GCS and its dashboard agent
# once both got 48199, and the head did not start).
_HANDED_OUT: set[int] = set()


def _free_port() -> int:
  while True:
    with socket.socket() as sock:
      sock.bind(("127.0.0.1", 0))
      port = sock.getsockname()[1]
    if port not in _HANDED_OUT:
      _HANDED_OUT.add(port)
      return port


def _ray_start(args: list[str], log: pathlib.Path) -> subprocess.Popen:
  """`ray start ... --block` in its own process group; its per-node agents on free ports
  (their defaults are fixed ports, which two nodes on one machine would share). The log is
  appended to, so that a retried start keeps what the failed one printed."""
  command = [RAY_CLI, "start", *args, "--disable-usage-stats", "--block",
             f"--dashboard-agent-listen-port={_free_port()}",
             f"--metrics-export-port={_free_port()}",
             f"--runtime-env-agent-port={_free_port()}"]
  with open(log, "a") as out:
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True, env=os.environ.copy())


def _kill_group(process: subprocess.Popen, sig: int) -> None:
  try:
    os.killpg(process.pid, sig)
  except ProcessLookupError:
    pass


@dataclasses.dataclass
class TwoNodes:
  address: str          # the head's GCS, as `ray start --address` takes it
  node2_id: str         # the second node's Ray node id
  node2: subprocess.Popen
  head: subprocess.Popen

  def lose_node2(self) -> None:
    """The second node's `ray start`, raylet and workers killed at once (SIGKILL)."""
    _kill_group(self.node2, signal.SIGKILL)
    self.node2.wait()


def _wait(what: str, ready, logs: pathlib.Path, timeout: float = 120.0):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    value = ready()
    if value:
      return value
    time.sleep(0.25)
  tails = "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}" for log in logs.glob("*.log"))
  raise TimeoutError(f"the Ray cluster: {what} not within {timeout:.0f} s\n{tails}")


@contextlib.contextmanager
def two_nodes(monkeypatch, head_cpus: int, node_cpus: int):
  """A TwoNodes with `ray.init` connected to it; stopped afterwards (only the processes
  this cluster started are killed). The second node carries a resource 'node2' that
  nothing asks for, so its presence shows in the resource reports."""
  import ray  # pylint: disable=g-import-not-at-top

  # Token authentication off for this cluster only: the `ray start` processes, the driver
  # and the workers all inherit it (a worker of a cluster that has it on must not).
  for name, value in {**worker_env(), "RAY_AUTH_MODE": "disabled"}.items():
    monkeypatch.setenv(name, value)
  # Short: Ray's Unix sockets live under it (a socket path has ~100 characters at most).
  temp = pathlib.Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
  port = _free_port()
  processes = []
  try:
    processes.append(_ray_start(
        ["--head", f"--port={port}", f"--num-cpus={head_cpus}", '--resources={"head": 1}',
         "--include-dashboard=false", f"--temp-dir={temp}"], temp / "head.log"))

    def gcs_listens():
      try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
      except OSError:
        return False
    _wait("the head's GCS listening", gcs_listens, temp)
    address = f"127.0.0.1:{port}"
    node2_args = [f"--address={address}", f"--num-cpus={node_cpus}",
                  '--resources={"node2": 1}']
    processes.append(_ray_start(node2_args, temp / "node2.log"))
    ray.init(address=address, log_to_driver=False)
    starts = [1]

    def node2_joined():
      # `ray start` gives up when its raylet has not registered within 30 s (fixed in Ray
      # 2.60), which a loaded 2-core machine can exceed: start it again, at most 3 times.
      if processes[1].poll() is not None and starts[0] < NODE_STARTS:
        _kill_group(processes[1], signal.SIGKILL)
        starts[0] += 1
        processes[1] = _ray_start(node2_args, temp / "node2.log")
      return next((n["NodeID"] for n in ray.nodes()
                   if n["Alive"] and "node2" in n["Resources"]), None)
    node2_id = _wait("the second node joining", node2_joined, temp, timeout=300.0)
    yield TwoNodes(address, node2_id, processes[1], processes[0])
  finally:
    ray.shutdown()
    for process in reversed(processes):
      _kill_group(process, signal.SIGTERM)  # `ray start --block` stops its node on TERM
    for process in reversed(processes):
      try:
        # Briefly: the head's graceful stop outlasts 10 s (it was always cut short by the
        # SIGKILL below), and the group's SIGKILL ends this throwaway cluster either way.
        process.wait(timeout=2)
      except subprocess.TimeoutExpired:
        pass
      _kill_group(process, signal.SIGKILL)  # whatever of the group outlived it
    shutil.rmtree(temp, ignore_errors=True)


def busy_cpus(node_id: str, node_cpus: int) -> float:
  """CPUs in use on the second node; 0 until its resources are reported (its 'node2'
  resource is always listed; a used-up CPU is not)."""
  from ray._private import state as ray_state  # pylint: disable=g-import-not-at-top

  available = ray_state.available_resources_per_node().get(node_id, {})
  return node_cpus - available.get("CPU", 0.0) if "node2" in available else 0.0


def wait_for_alive_nodes(count: int, timeout: float = 120.0) -> int:
  """The number of nodes Ray lists alive, once it is `count` or `timeout` passed: a node
  removed without grace is declared dead by the GCS's health checks, some seconds later
  (more on a loaded machine)."""
  import ray  # pylint: disable=g-import-not-at-top

  deadline = time.monotonic() + timeout
  while True:
    alive = len([n for n in ray.nodes() if n["Alive"]])
    if alive == count or time.monotonic() > deadline:
      return alive
    time.sleep(0.5)
