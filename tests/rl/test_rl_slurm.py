"""`c2jax rl` with its actors as a SLURM batch job (tools/setup_slurm.sh's one-node
cluster; skipped with the reason where it cannot start): `scancel --signal=TERM` reaches
the learner and every actor of the step at once; the learner checkpoints the step in
flight, the actors are stopped, and the job ends COMPLETED with exit code 0; `scontrol
requeue` resumes it to the last step with no group lost or trained twice and no prompt
left leased."""

import json
import pathlib
import subprocess

import pytest

from c2jax.rl.queue.group_queue import GroupQueue
from tests import slurm_testlib as slurm_lib
from tests.rl import rl_testlib
from tests.subprocess_checks import child_env

pytestmark = pytest.mark.slow  # a `c2jax rl` run with its actors, twice
STEPS = 4


def _checkpoints(workdir) -> list[int]:
  root = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.exists() else []


def test_rl_job_preempted_by_slurm_checkpoints_and_the_requeued_job_finishes(
    slurm, tmp_path, data_cache):
  del slurm
  workdir = tmp_path / "run"
  args = [f"--config.data.cache_dir={data_cache}", "--config.data.vocab_size=1024",
          "--config.data.max_total_bytes=4000000", "--config.data.tokenizer_train_bytes=300000",
          f"--config.learner.steps={STEPS}", "--config.learner.checkpoint_every=1"]
  script = slurm_lib.batch_script(
      tmp_path / "rl.sbatch", "c2jax-test-rl", 1, 2,
      ["-m", "c2jax.cli", "rl", "--config=configs/rl.py:test", f"--workdir={workdir}", *args])
  job_id = slurm_lib.submit(script, child_env())
  log = tmp_path / f"slurm-{job_id}.out"
  try:
    # Preempted mid-run: past its first step, with actors rolling out.
    slurm_lib.wait_for(lambda: (max(_checkpoints(workdir), default=0) >= 1
                                and rl_testlib.actor_pids(workdir))
                       or slurm_lib.ended(job_id), "step 1 with actors running", job_id)
    assert not slurm_lib.ended(job_id), log.read_text(errors="replace")[-3000:]
    actors = rl_testlib.actor_pids(workdir)
    subprocess.run(["scancel", "--signal=TERM", job_id], check=True)
    slurm_lib.wait_for(lambda: slurm_lib.ended(job_id), "the job to end", job_id)
    job, output = slurm_lib.job(job_id), log.read_text(errors="replace")
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (job, output[-3000:])
    stopped = json.loads(output.strip().splitlines()[-1])["preempted"]
    assert stopped is not None and 1 <= stopped < STEPS, output[-3000:]
    assert stopped in _checkpoints(workdir)
    assert not rl_testlib.actor_pids(workdir) and not any(
        pathlib.Path(f"/proc/{pid}").exists() for pid in actors)

    slurm_lib.requeue(job_id)
    slurm_lib.wait_for(lambda: slurm_lib.job(job_id)["Restarts"] == "1"
                       and slurm_lib.ended(job_id), "the requeued job to end", job_id)
    job, output = slurm_lib.job(job_id), log.read_text(errors="replace")
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (job, output[-3000:])
    assert f"rl: resuming from step {stopped}" in output, output[-3000:]
  finally:
    slurm_lib.cancel(job_id)
  queue = GroupQueue(workdir / "queue", capacity=1, max_lag=0)
  manifests = queue.trained_steps()
  assert sorted(manifests) == list(range(1, STEPS + 1))
  trained = [group for step in sorted(manifests) for group in manifests[step]]
  assert len(trained) == len(set(trained)) == STEPS  # one group a step, never twice
  assert queue.counts()["claimed"] == 0
  assert not list((workdir / "pool" / "leased").rglob("*.json"))
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [row["step"] for row in rows if "loss" in row] == list(range(1, STEPS + 1))
