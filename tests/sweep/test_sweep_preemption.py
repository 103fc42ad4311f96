"""`c2jax sweep` on SIGTERM: the running point checkpoints its progress and exits 0 (not
marked done), no other point starts, the runner exits 0, and the rerun finishes every
point, resuming the stopped one without redoing its finished episodes. The points are
oracle evaluations of a few procgen tasks (no model to compile)."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from c2jax import preemption

REPO = pathlib.Path(__file__).resolve().parents[2]
# Enough episodes per point that SIGTERM, sent once the first is recorded, lands before
# the last (oracle episodes take milliseconds: with 4, a quiet machine finished them all).
TASKS = 16
SWEEP_FILE = '''
from c2jax import sweep


def get_sweep(arg=None):
  return sweep.Sweep(
      verb="eval", config="configs/eval.py:procgen",
      fixed={"suite.args.count": %d, "eval.samples": 1, "eval.ks": (1,),
             "eval.progress": False, "policy.concurrency": 1},
      points=[{"eval.seed": seed} for seed in range(3)],
      metrics={"accuracy": sweep.from_json("summary.json", "overall.accuracy")})
''' % TASKS


def _records(run_dir):
  path = run_dir / "results.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_sigterm_stops_the_sweep_cleanly_and_the_rerun_resumes(tmp_path):
  sweep_file, workdir = tmp_path / "eval_sweep.py", tmp_path / "sweep"
  sweep_file.write_text(SWEEP_FILE)
  command = [sys.executable, "-m", "c2jax.cli", "sweep", str(sweep_file),
             f"--workdir={workdir}", "--parallel=1"]
  env = dict(os.environ, PYTHONPATH=str(REPO), C2JAX_XLA_CACHE="off")
  runner = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 240
  started = lambda: [d for d in (workdir / "runs").iterdir() if _records(d)] \
      if (workdir / "runs").exists() else []
  while not started():
    assert runner.poll() is None and time.monotonic() < deadline, runner.stderr.read()[-3000:]
    time.sleep(0.05)
  [stopped] = started()
  runner.send_signal(signal.SIGTERM)
  out, err = runner.communicate(timeout=300)
  assert runner.returncode == 0, err[-3000:]
  assert json.loads(out.strip().splitlines()[-1])["preempted"] is True
  assert f"sweep: stopped {stopped.name}" in out, out[-3000:]
  assert preemption.was_preempted(stopped) and not (stopped / "sweep_done.json").exists()
  kept = _records(stopped)
  assert 1 <= len(kept) < TASKS
  launched = (workdir / "launches.jsonl").read_text().splitlines()
  assert len(launched) == 1  # nothing started after the signal

  done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  summary = json.loads(done.stdout.strip().splitlines()[-1])
  assert summary["done"] == summary["points"] == 3 and summary["preempted"] is False
  after = _records(stopped)
  assert after[:len(kept)] == kept and len(after) == TASKS  # resumed, nothing redone
  assert len({(r["task_id"], r["sample"]) for r in after}) == TASKS
  assert not preemption.was_preempted(stopped)
