"""`c2jax sweep --backend=ray`: points run as Ray tasks on a local Ray, resume included."""

import json
import os
import pathlib

import pytest

from c2jax import sweep

ray = pytest.importorskip("ray")
from tests import ray_testlib  # pylint: disable=g-import-not-at-top
pytestmark = pytest.mark.slow
REPO = pathlib.Path(__file__).resolve().parents[2]

SMOKE_SWEEP = '''
from c2jax import sweep

def get_sweep(arg=None):
  return sweep.Sweep(verb="smoke", config="{repo}/configs/smoke.py:tiny",
                     run_args=("--metrics={{run_dir}}/metrics.jsonl",),
                     fixed={{"steps": 2, "batch_size": 2, "seq_len": 16, "log_every": 1}},
                     grid={{"learning_rate": [0.001, 0.003]}},
                     metrics={{"loss": sweep.last("loss")}})
'''


@pytest.fixture(scope="module")
def local_ray():
  env = ray_testlib.worker_env()
  saved = os.environ.get("RAY_memory_monitor_refresh_ms")
  os.environ["RAY_memory_monitor_refresh_ms"] = env["RAY_memory_monitor_refresh_ms"]
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
           runtime_env={"env_vars": env})
  yield
  ray.shutdown()
  if saved is None:
    os.environ.pop("RAY_memory_monitor_refresh_ms")
  else:
    os.environ["RAY_memory_monitor_refresh_ms"] = saved


def test_points_run_as_ray_tasks_and_resume(local_ray, tmp_path):
  path = tmp_path / "ray_sweep.py"
  path.write_text(SMOKE_SWEEP.format(repo=REPO))
  plan = sweep.load(str(path))
  workdir = tmp_path / "out"
  said = []
  summary = sweep.run(plan, workdir, parallel=2, backend="ray", say=said.append)
  assert summary["done"] == 2 and summary["failed"] == []
  rows = sweep.read(workdir)
  assert [r["learning_rate"] for r in rows] == [0.001, 0.003]
  assert all(r["status"] == "done" and r["loss"] > 0 for r in rows)
  for row in rows:
    log = pathlib.Path(row["log"]).read_text()
    assert "=== sweep launch" in log and "smoke: loss" in log
    # A Ray worker, not this process, launched the point and wrote its marker.
    marker = json.loads((pathlib.Path(row["run_dir"]) / "sweep_done.json").read_text())
    assert marker["launcher_pid"] != os.getpid()
  # One finished point forgotten: a rerun launches that one only.
  (pathlib.Path(rows[1]["run_dir"]) / "sweep_done.json").unlink()
  again = sweep.run(plan, workdir, parallel=2, backend="ray", say=said.append)
  assert again["launched"] == [rows[1]["point"]] and again["done"] == 2
  backends = [json.loads(l)["backend"] for l in (workdir / "launches.jsonl").read_text()
              .splitlines()]
  assert backends == ["ray"] * 3
