"""experiments/findings/kl_estimators.py runs end to end and writes its plot."""

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_script_writes_plot_and_table(tmp_path):
  out = tmp_path / "kl.png"
  result = subprocess.run([sys.executable, "-m", "experiments.findings.kl_estimators",
                           "--samples", "20000", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert out.stat().st_size > 10_000
  assert "k3" in result.stdout and "k1" in result.stdout
