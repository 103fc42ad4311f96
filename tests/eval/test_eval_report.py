"""`c2jax eval report`: markdown + JSON table across run dirs and the Pareto PNG."""

import json
import os
import subprocess
import sys

from c2jax.eval import report, results

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(workdir, scores, tokens, infra=0):
  with results.ResultsStore(workdir) as store:
    for i, (score, tok) in enumerate(zip(scores, tokens)):
      store.append({"task_id": f"t{i // 2}", "sample": i % 2, "score": score,
                    "solved": score == 1.0, "infra_error": None, "completion_tokens": tok,
                    "turns": 2, "tool_calls": 3, "wall_s": 1.5, "cost": None,
                    "suite": "procgen", "policy": workdir.name, "finish_reason": "finish"})
    for j in range(infra):
      store.append({"task_id": f"t{j}", "sample": 9, "score": None, "infra_error": "503",
                    "suite": "procgen", "policy": workdir.name})
  results.write_summary(workdir, {"overall": {"pass@1": 0, "pass@2": 0}})


def test_report_table_json_and_png(tmp_path):
  _run(tmp_path / "small", [1, 0, 0, 0], [10, 12, 14, 16], infra=1)  # acc .25, median 13
  _run(tmp_path / "big", [1, 1, 1, 0], [100, 90, 110, 120])  # acc .75, median 105
  _run(tmp_path / "bad", [0, 0, 0, 0], [200, 200, 200, 200])  # dominated by both
  out = tmp_path / "cmp" / "table"
  proc = subprocess.run([sys.executable, "-c", "from c2jax.cli import run; run()", "eval",
                         "report", str(tmp_path / "small"), str(tmp_path / "big"),
                         str(tmp_path / "bad"), f"--out={out}"],
                        env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  table = json.loads(out.with_suffix(".json").read_text())
  rows = {r["run"]: r for r in table["runs"]}
  assert rows["small"]["accuracy"] == 0.25 and rows["small"]["median_completion_tokens"] == 13
  assert rows["small"]["infra_errors"] == 1 and rows["small"]["episodes"] == 4
  assert rows["big"]["accuracy"] == 0.75 and rows["big"]["pass@2"] == 1.0
  assert rows["big"]["best_of_2"] == 1.0 and rows["small"]["best_of_2"] == 0.5
  assert table["pareto_front"] == ["small", "big"]
  md = out.with_suffix(".md").read_text().splitlines()
  assert md[0].startswith("| run | suite | policy |") and len(md) == 2 + 3
  assert "| small | procgen | small | 2 | 4 | 0.250 |" in md[2]
  png = out.with_suffix(".png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_pareto_front_ignores_runs_without_tokens():
  rows = [{"run": "a", "accuracy": 0.5, "median_completion_tokens": None},
          {"run": "b", "accuracy": 0.4, "median_completion_tokens": 10}]
  assert [r["run"] for r in report.pareto_front(rows)] == ["b"]
