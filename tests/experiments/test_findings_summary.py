"""experiments/findings/summary_vs_compaction.py --smoke: every context-management mode
runs on the same tasks, summarises as configured, and the plot and JSON are written."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from experiments.findings import summary_vs_compaction

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_smoke_runs_every_mode_and_writes_plot_and_json(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-m", "experiments.findings.summary_vs_compaction",
                           "--smoke", "--out", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=env)
  assert result.returncode == 0, result.stderr[-2000:]
  assert (tmp_path / "summary_vs_compaction.png").stat().st_size > 10_000
  data = json.loads((tmp_path / "summary_vs_compaction.json").read_text())
  modes = data["modes"]
  assert list(modes) == ["none", "self_summary", "compaction"]
  assert modes["none"]["summaries"]["mean"] == 0
  assert modes["self_summary"]["summaries"]["mean"] > 0
  assert modes["compaction"]["summaries"]["mean"] > 0
  # Only compaction pays for separate summary calls; every mode stays within its budget.
  assert modes["compaction"]["compaction_tokens"]["mean"] > 0
  assert modes["self_summary"]["compaction_tokens"]["mean"] == 0
  budget = data["settings"]["max_total_tokens"]
  assert all(e["tokens"] <= budget for e in data["episodes"])
  assert len(data["episodes"]) == 3 * data["settings"]["tasks"]
  assert {"mean", "std", "min", "max"} <= set(data["self_summary_minus_compaction"]["tokens"])
  assert data["verdict"]["summarised"] and "text" in data["verdict"]


def test_a_real_run_needs_a_checkpoint():
  with pytest.raises(SystemExit):
    summary_vs_compaction.parse_args(["--seeds", "2"])
  with pytest.raises(SystemExit):
    summary_vs_compaction.parse_args(["--smoke", "--seeds", "0"])
