"""`c2jax sweep --backend=ray` on a two-node Ray cluster on this machine (Ray's own
multi-node harness, ray.cluster_utils.Cluster: a head and a second node, each its own
raylet with its own resources): points run on both nodes, and when the second node is
lost mid-run (its raylet and workers killed) its points rerun on the head."""

import json
import os
import pathlib
import threading
import time

import pytest

from c2jax import sweep

ray = pytest.importorskip("ray")
from ray import cluster_utils  # pylint: disable=g-import-not-at-top
from ray._private import state as ray_state  # pylint: disable=g-import-not-at-top

pytestmark = pytest.mark.slow
REPO = pathlib.Path(__file__).resolve().parents[2]

SWEEP = '''
from c2jax import sweep

def get_sweep(arg=None):
  return sweep.Sweep(verb="smoke", config="{repo}/configs/smoke.py:tiny",
                     run_args=("--metrics={{run_dir}}/metrics.jsonl",),
                     fixed={{"steps": 2, "batch_size": 2, "seq_len": 16, "log_every": 1}},
                     grid={{"learning_rate": [0.001, 0.002, 0.003]}},
                     metrics={{"loss": sweep.last("loss")}})
'''


@pytest.fixture
def two_nodes(monkeypatch):
  """(cluster, second node): a head of 1 CPU and a node of 2; both stopped afterwards."""
  # Workers import this checkout's c2jax. Ray's memory monitor is off: on a shared test
  # machine it kills small workers for other processes' memory.
  path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
  for name, value in (("PYTHONPATH", path), ("JAX_PLATFORMS", "cpu"),
                      ("RAY_memory_monitor_refresh_ms", "0")):
    monkeypatch.setenv(name, value)
  cluster = cluster_utils.Cluster(initialize_head=True, head_node_args=dict(
      num_cpus=1, resources={"head": 1}, include_dashboard=False))
  try:
    node2 = cluster.add_node(num_cpus=2, resources={"node2": 2})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster, node2
  finally:
    ray.shutdown()
    cluster.shutdown()  # kills exactly the processes this cluster started


def _busy_cpus(node_id: str) -> float:
  """CPUs in use on the second node (one per point); 0 until its resources are reported
  (its 'node2' resource, which nothing uses, is always listed; a used-up CPU is not)."""
  available = ray_state.available_resources_per_node().get(node_id, {})
  return 2.0 - available.get("CPU", 0.0) if "node2" in available else 0.0


def test_points_use_both_nodes_and_survive_losing_one(two_nodes, tmp_path):
  cluster, node2 = two_nodes
  alive = [n for n in ray.nodes() if n["Alive"]]
  assert len(alive) == 2 and node2.node_id in [n["NodeID"] for n in alive]
  path = tmp_path / "two_node_sweep.py"
  path.write_text(SWEEP.format(repo=REPO))
  plan, workdir, said = sweep.load(str(path)), tmp_path / "out", []

  def launched() -> int:
    return sum(log.read_text().count("=== sweep launch")
               for log in workdir.glob("**/sweep.log"))

  lost = []
  def lose_node2_once_it_runs_points():
    deadline = time.time() + 900
    while time.time() < deadline:
      # Two points launched at once: the head has one CPU, so one runs on the second node.
      if _busy_cpus(node2.node_id) and launched() >= 2:
        time.sleep(2)
        cluster.remove_node(node2, allow_graceful=False)
        lost.append(launched())
        return
      time.sleep(0.5)
  killer = threading.Thread(target=lose_node2_once_it_runs_points)
  killer.start()
  summary = sweep.run(plan, workdir, parallel=3, backend="ray", say=said.append)
  killer.join()
  assert lost, "no point ever ran on the second node"
  # Nothing lost: every point finished, those of the lost node on a rerun.
  assert summary["done"] == 3 and summary["failed"] == [], said
  rows = sweep.read(workdir)
  assert all(r["status"] == "done" and r["loss"] > 0 for r in rows)
  launches = [pathlib.Path(r["log"]).read_text().count("=== sweep launch") for r in rows]
  assert sum(count - 1 for count in launches) >= 1, launches  # rerun on the head
  assert len([n for n in ray.nodes() if n["Alive"]]) == 1
  markers = [json.loads((pathlib.Path(r["run_dir"]) / "sweep_done.json").read_text())
             for r in rows]
  assert all(m["launcher_pid"] != os.getpid() for m in markers)
