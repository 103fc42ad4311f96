"""c2jax under a real SLURM (tools/setup_slurm.sh: a one-node cluster on this machine,
started by the `slurm` fixture; skipped with the reason where it cannot start, e.g. not
root). The sbatch script of docs/cluster.md, cut to `tiny`, runs a 2-process
`c2jax pretrain` through srun: process count and coordinator come from SLURM's variables.
`scancel --signal=TERM` makes both processes checkpoint the step in flight and the job
end with exit code 0; `scontrol requeue` runs it again, and it resumes to the losses of
the uninterrupted 2-process run."""

import random
import re
import subprocess

import pytest

from distributed_testlib import ARGS, PRETRAIN, STEPS, pair_env
from tests import slurm_testlib as slurm_lib
from train_testlib import TINY, losses

pytestmark = pytest.mark.slow  # each job runs two JAX processes


def test_scancel_term_checkpoints_exit_0_and_requeue_resumes_exactly(
    slurm, tmp_path, data_cache, two_process_reference):
  del slurm
  workdir = tmp_path / "run"
  script = slurm_lib.batch_script(
      tmp_path / "pretrain.sbatch", "c2jax-test-pretrain", 2, 1,
      ["-m", "c2jax.cli", "pretrain", f"--config={PRETRAIN}", f"--workdir={workdir}",
       f"--config.data.cache_dir={data_cache}", *TINY, *ARGS])
  job_id = slurm_lib.submit(script, pair_env())
  log = tmp_path / f"slurm-{job_id}.out"
  try:
    at_step = random.randint(1, 4)
    metrics = workdir / "metrics.jsonl"
    slurm_lib.wait_for(lambda: metrics.exists() and max(losses(workdir), default=0) >= at_step
                       or slurm_lib.ended(job_id), f"step {at_step}", job_id)
    assert not slurm_lib.ended(job_id), log.read_text()[-3000:]
    subprocess.run(["scancel", "--signal=TERM", job_id], check=True)
    slurm_lib.wait_for(lambda: slurm_lib.ended(job_id), "the job to end", job_id)
    job = slurm_lib.job(job_id)
    output = log.read_text()
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (job, output[-3000:])
    # Both processes stopped after the same step, past the signal, with its checkpoint.
    stopped = {int(m) for m in re.findall(r'"preempted": (\d+)', output)}
    assert len(re.findall(r'"preempted": \d+', output)) == 2, output[-3000:]
    [step] = stopped
    assert at_step < step < STEPS and (workdir / "checkpoints" / str(step)).is_dir()
    assert "distributed: process 1 of 2" in output and "(slurm detected)" in output

    slurm_lib.requeue(job_id)
    slurm_lib.wait_for(lambda: slurm_lib.job(job_id)["Restarts"] == "1"
                       and slurm_lib.ended(job_id), "the requeued job to end", job_id)
    job = slurm_lib.job(job_id)
    output = log.read_text()
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (job, output[-3000:])
    assert output.count(f"resume: step {step} from") == 2
    assert losses(workdir) == losses(two_process_reference)
    assert losses(workdir / "process_1") == losses(two_process_reference / "process_1")
  finally:
    slurm_lib.cancel(job_id)


def test_the_daemons_do_not_hold_the_set_up_lock(slurm):
  """setup_slurm.sh serialises itself with a lock; the daemons it starts must not inherit
  (and hold) it, or every later call, the tests' own, waits forever (seen: munged did)."""
  import os  # pylint: disable=import-outside-toplevel
  import pathlib  # pylint: disable=import-outside-toplevel
  holders = []
  for proc in pathlib.Path("/proc").iterdir():
    if not proc.name.isdigit():
      continue
    try:
      name = (proc / "comm").read_text().strip()
      links = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
    except OSError:
      continue
    if name in ("munged", "slurmctld", "slurmd", "slurmstepd") and any(
        "c2jax-setup-slurm.lock" in link for link in links):
      holders.append(name)
  assert not holders, holders
  again = subprocess.run(["bash", "tools/setup_slurm.sh"], cwd=slurm_lib.REPO,
                         capture_output=True, text=True, timeout=60)
  assert again.returncode == 0 and "is up" in again.stdout, again.stdout + again.stderr
