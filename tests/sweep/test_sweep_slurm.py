"""`c2jax sweep` as a SLURM batch job (tools/setup_slurm.sh's one-node cluster; skipped
with the reason where it cannot start): `scancel --signal=TERM` reaches the runner and
the running point at once; the point keeps its finished episodes, nothing else starts,
and the job ends COMPLETED with exit code 0; `scontrol requeue` finishes every point,
resuming the stopped one without redoing an episode. The points are oracle evaluations
of procgen tasks (test_sweep_preemption.py's sweep)."""

import json
import subprocess

import pytest

from c2jax import preemption
from tests import slurm_testlib as slurm_lib
from tests.subprocess_checks import child_env
from tests.sweep.test_sweep_preemption import SWEEP_FILE, TASKS, _records

pytestmark = pytest.mark.slow


def test_sweep_job_preempted_by_slurm_stops_cleanly_and_the_requeued_job_finishes(
    slurm, tmp_path):
  del slurm
  sweep_file, workdir = tmp_path / "eval_sweep.py", tmp_path / "sweep"
  sweep_file.write_text(SWEEP_FILE)
  script = slurm_lib.batch_script(
      tmp_path / "sweep.sbatch", "c2jax-test-sweep", 1, 2,
      ["-m", "c2jax.cli", "sweep", sweep_file, f"--workdir={workdir}", "--parallel=1"])
  job_id = slurm_lib.submit(script, child_env(C2JAX_XLA_CACHE="off"))
  log = tmp_path / f"slurm-{job_id}.out"
  started = lambda: [d for d in (workdir / "runs").iterdir() if _records(d)] \
      if (workdir / "runs").exists() else []
  try:
    slurm_lib.wait_for(lambda: started() or slurm_lib.ended(job_id), "a point's first episode",
                       job_id)
    assert not slurm_lib.ended(job_id), log.read_text(errors="replace")[-3000:]
    [stopped] = started()
    subprocess.run(["scancel", "--signal=TERM", job_id], check=True)
    slurm_lib.wait_for(lambda: slurm_lib.ended(job_id), "the job to end", job_id)
    job, output = slurm_lib.job(job_id), log.read_text(errors="replace")
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (job, output[-3000:])
    assert json.loads(output.strip().splitlines()[-1])["preempted"] is True
    assert preemption.was_preempted(stopped) and not (stopped / "sweep_done.json").exists()
    kept = _records(stopped)
    assert 1 <= len(kept) < TASKS
    assert len((workdir / "launches.jsonl").read_text().splitlines()) == 1

    slurm_lib.requeue(job_id)
    slurm_lib.wait_for(lambda: slurm_lib.job(job_id)["Restarts"] == "1"
                       and slurm_lib.ended(job_id), "the requeued job to end", job_id)
    job, output = slurm_lib.job(job_id), log.read_text(errors="replace")
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (job, output[-3000:])
  finally:
    slurm_lib.cancel(job_id)
  summary = json.loads(output.strip().splitlines()[-1])
  assert summary["done"] == summary["points"] == 3 and summary["preempted"] is False
  after = _records(stopped)
  assert after[:len(kept)] == kept and len(after) == TASKS  # resumed, nothing redone
  assert len({(r["task_id"], r["sample"]) for r in after}) == TASKS
  assert not preemption.was_preempted(stopped)
