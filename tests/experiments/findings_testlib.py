"""Helpers for the tests of experiments/findings/: run a script's --smoke."""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def run_smoke(name: str, tmp_path, *extra: str, timeout: int = 900) -> tuple[dict, pathlib.Path]:
  """Runs `python -m experiments.findings.<name> --smoke` into tmp_path/out; returns its
  JSON numbers and the workdir of its runs, after checking both outputs were written."""
  out, workdir = tmp_path / "out", tmp_path / "runs"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, "-m", f"experiments.findings.{name}", "--smoke", "--out", str(out),
       "--workdir", str(workdir), *extra],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
  assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
  assert (out / f"{name}.png").stat().st_size > 5_000
  numbers = json.loads((out / f"{name}.json").read_text())
  assert numbers["finding"] == name and numbers["smoke"] is True
  assert numbers["seeds"] == [0] and numbers["date"].startswith("20")
  assert isinstance(numbers["verdict"], str) and numbers["verdict"]
  return numbers, workdir
