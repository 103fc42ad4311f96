"""tools/bench/hf_io.py --smoke: generate -> load (init_from) -> export runs end to
end at a few MB, reports every figure docs/benchmarks.md quotes, and cleans up."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_smoke_reports_each_step_and_deletes_its_files(tmp_path):
  workdir = tmp_path / "bench"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run([sys.executable, "-m", "tools.bench.hf_io", "--workdir", str(workdir),
                         "--smoke"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300, check=False)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  rows = {row["step"]: row for row in (json.loads(line) for line in done.stdout.splitlines()
                                        if line.startswith("{"))}
  assert set(rows) == {"generate", "load", "export"}
  assert rows["generate"]["shards"] > 1 and rows["export"]["shards"] > 1
  # Every parameter byte written is loaded (bf16 on disk; the router bias is float32).
  assert abs(rows["load"]["bytes"] - rows["generate"]["bytes"]) < 0.01 * rows["generate"]["bytes"]
  for row in rows.values():
    assert row["seconds"] > 0 and row["gb_per_s"] > 0 and row["peak_rss"] > 0
  assert "| load |" in done.stdout and not workdir.exists()
