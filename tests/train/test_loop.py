"""End-to-end training jobs at tiny size: resume after SIGKILL, corrupt checkpoints,
NaN stops, phase chaining, and multi-device equivalence."""

import json
import os
import random
import shutil
import signal
import subprocess
import time

import pytest

from c2jax.train import profiling

from train_testlib import REPO, job_command, losses, run_job, signal_at_step, summary

pytestmark = pytest.mark.slow
PRETRAIN = "configs/pretrain.py:tiny"


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, data_cache):
  workdir = tmp_path_factory.mktemp("reference")
  # Steps 4..6 are traced: every test comparing losses with this run also shows that a
  # trace changes none of them.
  run_job("pretrain", PRETRAIN, workdir, data_cache, "--config.train.steps=12",
          "--config.train.checkpoint_every=4", "--config.train.eval_every=6",
          "--config.profile.steps=(4, 6)")
  return workdir


def test_metrics_evals_and_tensorboard(reference_run):
  rows = [json.loads(l) for l in (reference_run / "metrics.jsonl").read_text().splitlines()]
  steps = [r["step"] for r in rows if "loss" in r]
  assert steps == list(range(1, 13))
  evals = [r for r in rows if "eval_loss" in r]
  assert [r["step"] for r in evals] == [0, 6, 12]
  assert evals[2]["eval_loss"] < evals[1]["eval_loss"] < evals[0]["eval_loss"]
  assert all(r["codebase_perplexity"] > 1 for r in evals)
  assert any((reference_run / "tensorboard").iterdir())
  assert sorted(int(p.name) for p in (reference_run / "checkpoints").iterdir()
                if p.name.isdigit()) == [4, 8, 12]


def test_profile_traces_the_chosen_steps(reference_run):
  """profile.steps=(4, 6): one trace of steps 4..6 in WORKDIR/profile/process_0, with
  the host spans of those steps only (the checkpoint at 4, the eval at 6)."""
  logdir = reference_run / "profile" / "process_0"
  [run] = list((logdir / "plugins" / "profile").iterdir())
  assert list(run.glob("*.xplane.pb"))  # TensorBoard's profile plugin reads this
  spans = profiling.span_totals(logdir)
  assert {name: count for name, (count, _) in spans.items()} == {
      "train/data": 3, "train/step": 3, "train/checkpoint": 1, "train/eval": 1}
  assert all(ms > 0 for _, ms in spans.values())


def test_sigkill_then_resume_gives_identical_losses(tmp_path, data_cache, reference_run):
  workdir = tmp_path / "killed"
  cmd = job_command("pretrain", PRETRAIN, workdir, data_cache, "--config.train.steps=12",
                    "--config.train.checkpoint_every=4", "--config.train.eval_every=6")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    done = losses(workdir) if (workdir / "metrics.jsonl").exists() else {}
    # Kill mid-run once checkpoint 4 is committed (orbax renames it into place).
    if max(done, default=0) >= 6 and (workdir / "checkpoints" / "4").is_dir():
      break
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert max(losses(workdir)) < 12, "the job finished before it could be killed"
  result = run_job("pretrain", PRETRAIN, workdir, data_cache, "--config.train.steps=12",
                   "--config.train.checkpoint_every=4", "--config.train.eval_every=6")
  resumed_at = int(result.stdout.split("resume: step ")[1].split()[0])
  assert 4 <= resumed_at < 12
  assert losses(workdir) == losses(reference_run)


def test_sigterm_checkpoints_the_step_exits_0_and_resumes_exactly(
    tmp_path, data_cache, reference_run):
  workdir = tmp_path / "preempted"
  args = ("--config.train.steps=12", "--config.train.checkpoint_every=4",
          "--config.train.eval_every=6")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(job_command("pretrain", PRETRAIN, workdir, data_cache, *args),
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  at_step = random.randint(1, 9)
  [(code, out, err)] = signal_at_step([proc], workdir, at_step, signal.SIGTERM)
  assert code == 0, f"signalled at step {at_step}:\n{err[-3000:]}"
  stopped = summary(out)["preempted"]
  assert stopped is not None and at_step < stopped < 12, (at_step, out[-2000:])
  # The step it stopped after is checkpointed (data iterator included) and logged.
  assert (workdir / "checkpoints" / str(stopped)).is_dir()
  assert max(losses(workdir)) == stopped
  result = run_job("pretrain", PRETRAIN, workdir, data_cache, *args)
  assert f"resume: step {stopped}" in result.stdout
  assert losses(workdir) == losses(reference_run)


def _stopped_at(reference, workdir, step):
  """`workdir` as a run of `reference`'s that stopped after `step` leaves it: the
  checkpoints up to `step` and the metrics of steps 1..step."""
  for checkpoint in (reference / "checkpoints").iterdir():
    if checkpoint.name.isdigit() and int(checkpoint.name) <= step:
      shutil.copytree(checkpoint, workdir / "checkpoints" / checkpoint.name)
  rows = [l for l in (reference / "metrics.jsonl").read_text().splitlines()
          if json.loads(l).get("step", 0) <= step]
  (workdir / "metrics.jsonl").write_text("\n".join(rows) + "\n")
  return workdir


def test_corrupt_checkpoint_falls_back_to_previous(tmp_path, data_cache, reference_run):
  workdir = _stopped_at(reference_run, tmp_path / "corrupt", 8)
  damaged = 0
  for path in (workdir / "checkpoints" / "8" / "state").rglob("*"):
    if path.is_file() and path.stat().st_size > 0 and "metadata" not in path.name:
      path.write_bytes(b"\0garbage" * 3)
      damaged += 1
  assert damaged
  result = run_job("pretrain", PRETRAIN, workdir, data_cache, "--config.train.steps=12",
                   "--config.train.checkpoint_every=4", "--config.train.eval_every=6")
  assert "step 8 is corrupt or partial" in result.stdout
  assert "resume: step 4" in result.stdout
  assert losses(workdir) == losses(reference_run)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, data_cache, reference_run):
  workdir = _stopped_at(reference_run, tmp_path / "nan", 4)
  result = run_job("pretrain", PRETRAIN, workdir, data_cache, "--config.train.steps=12",
                   "--config.train.checkpoint_every=4", "--config.train.eval_every=0",
                   "--config.train.learning_rate=1e30", "--config.train.warmup_steps=0",
                   "--config.train.clip_norm=1e30", check=False)
  assert result.returncode == 3, result.stderr[-2000:]
  stopped_at = int(result.stderr.split(" at step ")[1].split(";")[0])
  assert 5 <= stopped_at <= 12  # the first steps after the blow-up
  assert "last good checkpoint is step 4" in result.stderr
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["4"]


def test_phases_chain_by_checkpoint(tmp_path, data_cache, reference_run):
  longctx = tmp_path / "longctx"
  result = run_job("pretrain", "configs/longctx.py:tiny", longctx, data_cache,
                   f"--config.init_from={reference_run}", "--config.train.steps=2",
                   "--config.train.seq_len=256", "--config.train.batch_size=1",
                   "--config.train.eval_every=0", "--config.train.checkpoint_every=2")
  assert f"init: parameters from {reference_run}/checkpoints step 12" in result.stdout
  first = losses(longctx)[1]
  assert first < losses(reference_run)[1] - 0.3  # starts from trained weights, not scratch
  config = json.loads((longctx / "config.json").read_text())
  assert config["model"]["rope"]["scaling"] == "yarn"
  assert config["train"]["seq_len"] == 256


def test_eight_devices_match_one_device(tmp_path, data_cache, reference_run):
  workdir = tmp_path / "eight"
  run_job("pretrain", PRETRAIN, workdir, data_cache, "--config.train.steps=4",
          "--config.train.checkpoint_every=4", "--config.train.eval_every=0",
          "--config.parallel.mesh.data=2", "--config.parallel.mesh.fsdp=4", devices=8)
  eight, one = losses(workdir), losses(reference_run)
  for step in range(1, 5):
    assert abs(eight[step] - one[step]) <= 1e-5, (step, eight[step], one[step])
