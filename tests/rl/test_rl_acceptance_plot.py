"""experiments/findings/plot_rl_acceptance.py: windowed table and plot from runs' metrics.jsonl."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run_dir(path, accepts):
  path.mkdir()
  rows = [{"step": s + 1, "loss": 0.1, "draft_tokens_per_step": 1 + 2 * a,
           "draft_acceptance": a} for s, a in enumerate(accepts)]
  rows.append({"step": len(accepts), "eval/pass_rate": 0.5})  # not a step row
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def test_table_averages_windows_and_the_plot_is_written(tmp_path):
  online = _run_dir(tmp_path / "online", [0.8, 0.6, 0.5])
  frozen = _run_dir(tmp_path / "frozen", [0.8, 0.4, 0.2])
  out = tmp_path / "fig.png"
  done = subprocess.run(
      [sys.executable, "-m", "experiments.findings.plot_rl_acceptance",
       f"online={online}", f"frozen={frozen}", "--window", "2", "--out", str(out)],
      cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "| online | 1-2 | 2.400 | 0.700 |" in done.stdout, done.stdout
  assert "| frozen | 3-3 | 1.400 | 0.200 |" in done.stdout, done.stdout
  assert out.stat().st_size > 1000


def test_a_run_without_speculation_is_refused(tmp_path):
  plain = tmp_path / "plain"
  plain.mkdir()
  (plain / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.1}) + "\n")
  done = subprocess.run(
      [sys.executable, "-m", "experiments.findings.plot_rl_acceptance", f"plain={plain}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode != 0 and "num_draft_tokens" in done.stderr
