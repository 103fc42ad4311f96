"""A Ray cluster of two nodes on this machine for the Ray tests (sweeps, RL actors): Ray's
own multi-node harness, ray.cluster_utils.Cluster, a head and a second node, each its own
raylet with its own CPUs, so that tasks really land on either and the second node can be
lost mid-run."""

import contextlib
import os
import pathlib
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def worker_env() -> dict[str, str]:
  """What Ray's workers need: this checkout's c2jax, CPU JAX, and Ray's memory monitor off
  (on a shared test machine it kills small workers for other processes' memory)."""
  path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
  return {"PYTHONPATH": path, "JAX_PLATFORMS": "cpu", "RAY_memory_monitor_refresh_ms": "0"}


@contextlib.contextmanager
def two_nodes(monkeypatch, head_cpus: int, node_cpus: int):
  """(cluster, second node) with `ray.init` connected; stopped afterwards (only the
  processes this cluster started are killed). The second node carries a resource
  'node2' that nothing asks for, so its presence shows in the resource reports."""
  import ray  # pylint: disable=g-import-not-at-top
  from ray import cluster_utils  # pylint: disable=g-import-not-at-top

  for name, value in worker_env().items():
    monkeypatch.setenv(name, value)
  cluster = cluster_utils.Cluster(initialize_head=True, head_node_args=dict(
      num_cpus=head_cpus, resources={"head": 1}, include_dashboard=False))
  try:
    node2 = cluster.add_node(num_cpus=node_cpus, resources={"node2": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster, node2
  finally:
    ray.shutdown()
    cluster.shutdown()


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
