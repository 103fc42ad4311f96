"""`c2jax sweep --backend=ray` on a two-node Ray cluster on this machine
(tests/ray_testlib.py): points run on both nodes, and when the second node is lost mid-run
(its raylet and workers killed) its points rerun on the head."""

import json
import os
import pathlib
import threading
import time

import pytest

from c2jax import sweep

ray = pytest.importorskip("ray")
from tests import ray_testlib  # pylint: disable=g-import-not-at-top

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
  """A head of 1 CPU and a second node of 2."""
  with ray_testlib.two_nodes(monkeypatch, head_cpus=1, node_cpus=2) as nodes:
    yield nodes


def test_points_use_both_nodes_and_survive_losing_one(two_nodes, tmp_path):
  alive = [n for n in ray.nodes() if n["Alive"]]
  assert len(alive) == 2 and two_nodes.node2_id in [n["NodeID"] for n in alive]
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
      if ray_testlib.busy_cpus(two_nodes.node2_id, 2) and launched() >= 2:
        time.sleep(2)
        two_nodes.lose_node2()
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
  assert ray_testlib.wait_for_alive_nodes(1) == 1
  markers = [json.loads((pathlib.Path(r["run_dir"]) / "sweep_done.json").read_text())
             for r in rows]
  assert all(m["launcher_pid"] != os.getpid() for m in markers)
