"""Tests under a real SLURM: the one-node cluster of tools/setup_slurm.sh (started once
per test process; the tests skip, with the reason, where it cannot start), and a job's
submission and state."""

import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED")


def start_cluster() -> None:
  """Starts (or finds) the cluster; pytest.skip with the reason when it cannot."""
  if os.geteuid() != 0:
    pytest.skip("SLURM: tools/setup_slurm.sh starts a cluster as root; run the suite as "
                "root to run these tests")
  started = subprocess.run(["bash", "tools/setup_slurm.sh"], cwd=REPO, capture_output=True,
                           text=True, timeout=600)
  if started.returncode:
    pytest.skip("SLURM did not start (tools/setup_slurm.sh): "
                + (started.stdout + started.stderr)[-600:])


def batch_script(path: pathlib.Path, name: str, tasks: int, cpus_per_task: int,
                 command: list[str]) -> pathlib.Path:
  """A requeueable sbatch script at `path` (as docs/cluster.md recommends): `tasks` tasks
  of `cpus_per_task` CPUs running `command` (python -m ...) through srun from the
  checkout, output appended to slurm-<job>.out beside the script."""
  path.write_text(
      "#!/bin/bash\n"
      f"#SBATCH --job-name={name}\n"
      f"#SBATCH --ntasks={tasks}\n"
      f"#SBATCH --cpus-per-task={cpus_per_task}\n"
      f"#SBATCH --output={path.parent}/slurm-%j.out\n"
      "#SBATCH --open-mode=append\n"
      "#SBATCH --requeue\n"
      f"#SBATCH --chdir={REPO}\n"
      "# srun sets SLURM_*; JAX picks the coordinator (the first node) from them.\n"
      f"srun {sys.executable} {' '.join(map(str, command))}\n")
  return path


def submit(script: pathlib.Path, env: dict) -> str:
  """sbatch `script` with `env` (exported to the job); the job id."""
  out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                       check=True, env=env).stdout
  return out.strip().split(";")[0]


def job(job_id: str) -> dict[str, str]:
  shown = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id],
                         capture_output=True, text=True, check=True).stdout
  return dict(re.findall(r"(\w+)=(\S*)", shown))


def ended(job_id: str) -> bool:
  return job(job_id)["JobState"] in ENDED


def wait_for(condition, what: str, job_id: str, timeout_s: float = 600) -> None:
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert time.monotonic() < deadline, f"timed out waiting for {what}: {job(job_id)}"
    time.sleep(0.1)


def requeue(job_id: str) -> None:
  """`scontrol requeue`, then the job released at once: SLURM holds a requeued batch job
  for two minutes, and refuses to start it within the second its last run ended (slurmd:
  "Job credential revoked")."""
  subprocess.run(["scontrol", "requeue", job_id], check=True)
  time.sleep(2.0)
  subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True)


def cancel(job_id: str) -> None:
  subprocess.run(["scancel", job_id], check=False)
