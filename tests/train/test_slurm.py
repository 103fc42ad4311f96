"""c2jax under a real SLURM (tools/setup_slurm.sh: a one-node cluster on this machine,
started by the `slurm` fixture; skipped with the reason where it cannot start, e.g. not
root). The sbatch script of docs/cluster.md, cut to `tiny`, runs a 2-process
`c2jax pretrain` through srun: process count and coordinator come from SLURM's variables.
`scancel --signal=TERM` makes both processes checkpoint the step in flight and the job
end with exit code 0; `scontrol requeue` runs it again, and it resumes to the losses of
the uninterrupted 2-process run."""

import os
import pathlib
import random
import re
import subprocess
import sys
import time

import pytest

from distributed_testlib import ARGS, PRETRAIN, STEPS, pair_env
from train_testlib import TINY, losses

pytestmark = pytest.mark.slow  # each job runs two JAX processes
REPO = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = """#!/bin/bash
#SBATCH --job-name=c2jax-test-pretrain
#SBATCH --ntasks=2
#SBATCH --cpus-per-task=1
#SBATCH --output={out}/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --chdir={repo}
# srun sets SLURM_*; JAX picks the coordinator (the first node) from them.
srun {python} -m c2jax.cli pretrain --config={config} --workdir={workdir} {args}
"""


@pytest.fixture(scope="session")
def slurm():
  if os.geteuid() != 0:
    pytest.skip("SLURM: tools/setup_slurm.sh starts a cluster as root; run the suite as "
                "root to run these tests")
  started = subprocess.run(["bash", "tools/setup_slurm.sh"], cwd=REPO, capture_output=True,
                           text=True, timeout=600)
  if started.returncode:
    pytest.skip("SLURM did not start (tools/setup_slurm.sh): "
                + (started.stdout + started.stderr)[-600:])


def _job(job_id: str) -> dict[str, str]:
  shown = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id],
                         capture_output=True, text=True, check=True).stdout
  return dict(re.findall(r"(\w+)=(\S*)", shown))


def _wait_for(condition, what, job_id, timeout_s=600):
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert time.monotonic() < deadline, f"timed out waiting for {what}: {_job(job_id)}"
    time.sleep(0.1)


def _finished(job_id: str) -> bool:
  return _job(job_id)["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                      "NODE_FAIL", "OUT_OF_MEMORY")


def test_scancel_term_checkpoints_exit_0_and_requeue_resumes_exactly(
    slurm, tmp_path, data_cache, two_process_reference):
  del slurm
  workdir = tmp_path / "run"
  script = tmp_path / "pretrain.sbatch"
  args = [f"--config.data.cache_dir={data_cache}", *TINY, *ARGS]
  script.write_text(SCRIPT.format(out=tmp_path, repo=REPO, python=sys.executable,
                                  config=PRETRAIN, workdir=workdir, args=" ".join(args)))
  job_id = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                          text=True, check=True, env=pair_env()).stdout.strip().split(";")[0]
  log = tmp_path / f"slurm-{job_id}.out"
  try:
    at_step = random.randint(1, 4)
    metrics = workdir / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and max(losses(workdir), default=0) >= at_step
              or _finished(job_id), f"step {at_step}", job_id)
    assert not _finished(job_id), log.read_text()[-3000:]
    subprocess.run(["scancel", "--signal=TERM", job_id], check=True)
    _wait_for(lambda: _finished(job_id), "the job to end", job_id)
    job = _job(job_id)
    output = log.read_text()
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (job, output[-3000:])
    # Both processes stopped after the same step, past the signal, with its checkpoint.
    stopped = {int(m) for m in re.findall(r'"preempted": (\d+)', output)}
    assert len(re.findall(r'"preempted": \d+', output)) == 2, output[-3000:]
    [step] = stopped
    assert at_step < step < STEPS and (workdir / "checkpoints" / str(step)).is_dir()
    assert "distributed: process 1 of 2" in output and "(slurm detected)" in output

    subprocess.run(["scontrol", "requeue", job_id], check=True)
    # SLURM holds a requeued batch job for two minutes before it may start again; an
    # operator (or this test) may release it, though not within the second its last run
    # ended: slurmd refuses a job credential as old as the revocation of the previous one.
    time.sleep(2.0)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True)
    _wait_for(lambda: _job(job_id)["Restarts"] == "1" and _finished(job_id),
              "the requeued job to end", job_id)
    job = _job(job_id)
    output = log.read_text()
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (job, output[-3000:])
    assert output.count(f"resume: step {step} from") == 2
    assert losses(workdir) == losses(two_process_reference)
    assert losses(workdir / "process_1") == losses(two_process_reference / "process_1")
  finally:
    subprocess.run(["scancel", job_id], check=False)
