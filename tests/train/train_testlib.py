"""Helpers for running `c2jax pretrain|sft` jobs in subprocesses at tiny size."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]

# Tiny, fast settings shared by every job test (one small corpus and tokenizer, cached).
# 4 MB of corpus: the first repositories in the corpus's hash order fill a smaller budget
# (site-packages/tornado alone, 2.7 MB, once the notebook test deps are installed), leaving
# no held-out repository.
TINY = ["--config.train.seq_len=32", "--config.train.batch_size=8",
        "--config.train.eval_batches=2", "--config.train.log_every=2",
        "--config.data.vocab_size=1024", "--config.data.max_total_bytes=4000000",
        "--config.data.tokenizer_train_bytes=300000"]


def job_command(verb, config, workdir, data_cache, *overrides):
  return [sys.executable, "-m", "c2jax.cli", verb, f"--config={config}",
          f"--workdir={workdir}", f"--config.data.cache_dir={data_cache}", *TINY, *overrides]


def run_job(verb, config, workdir, data_cache, *overrides, devices=1, check=True):
  env = dict(os.environ)
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env["JAX_PLATFORMS"] = "cpu"
  result = subprocess.run(job_command(verb, config, workdir, data_cache, *overrides),
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
  if check and result.returncode != 0:
    raise AssertionError(f"job failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                         f"{result.stderr[-3000:]}")
  return result


def losses(workdir):
  rows = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text()
          .splitlines() if line.strip()]
  return {row["step"]: row["loss"] for row in rows if "loss" in row}


# The eval stage at its smallest: two held-out tasks, one sample each, two short turns.
EVAL_STAGE = ["--config.eval.suite.args.count=2", "--config.eval.policy.slots=2",
              "--config.eval.agent.max_turns=2", "--config.eval.agent.max_turn_tokens=24"]


def signal_at_step(procs, workdir, step, signum=signal.SIGTERM, *, to=None,
                   timeout_s=300):
  """Sends `signum` to `to` (default: every process of `procs`) once metrics.jsonl of
  `workdir` holds a loss at `step` or later; returns each process's (returncode, stdout,
  stderr). Fails if the job ended before it could be signalled."""
  deadline = time.time() + timeout_s
  while time.time() < deadline and all(p.poll() is None for p in procs):
    done = losses(workdir) if (pathlib.Path(workdir) / "metrics.jsonl").exists() else {}
    if max(done, default=0) >= step:
      break
    time.sleep(0.05)
  assert all(p.poll() is None for p in procs), "the job ended before it was signalled"
  for p in procs if to is None else to:
    p.send_signal(signum)
  results = []
  for p in procs:
    try:
      out, err = p.communicate(timeout=max(deadline - time.time(), 60))
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise AssertionError(f"no exit within {timeout_s}s of {signum!r}") from None
    results.append((p.returncode, out, err))
  return results


def summary(stdout: str) -> dict:
  """The JSON summary a job prints last."""
  return json.loads(stdout.strip().splitlines()[-1])


def run_pipeline(root, data_cache):
  """`c2jax pipeline` on tiny with every stage cut to two steps and three tasks, and an
  eval stage of two tasks."""
  stages = []
  # SFT rows hold a whole trace (system message with the tool list, ~1k tokens).
  for stage, seq_len, batch in (("pretrain", 32, 8), ("longctx", 256, 1), ("sft", 1024, 1)):
    stages += [f"--config.{stage}.train.steps=2", f"--config.{stage}.train.seq_len={seq_len}",
               f"--config.{stage}.train.batch_size={batch}",
               f"--config.{stage}.train.eval_every=2", f"--config.{stage}.train.eval_batches=1",
               f"--config.{stage}.train.checkpoint_every=2"]
  return _pipeline("configs/pipeline.py:tiny", root, data_cache, stages + EVAL_STAGE,
                   as_user=True)


# The RL stage at the size of configs/rl.py:test: one step of one group of two rollouts.
RL_STAGE = ["--config.rl.learner.steps=1", "--config.rl.learner.groups_per_step=1",
            "--config.rl.learner.checkpoint_every=1", "--config.rl.rl.group_size=2",
            "--config.rl.rl.queue.capacity=1", "--config.rl.tasks.train_count=2",
            "--config.rl.tasks.heldout_count=1", "--config.rl.actors.count=1",
            "--config.rl.actors.slots=2", "--config.rl.agent.max_turns=1",
            "--config.rl.agent.max_turn_tokens=12", "--config.rl.eval.samples=1",
            "--config.rl.eval.slots=2", "--config.rl.eval.at_start=False"]


def run_rl_pipeline(root, data_cache):
  """`c2jax pipeline --config=configs/agent_sft.py:tiny_rl`: traces -> SFT (two steps) ->
  RL (one step)."""
  sft = ["--config.sft.train.steps=2", "--config.sft.train.batch_size=1",
         "--config.sft.train.eval_every=2", "--config.sft.train.eval_batches=1",
         "--config.sft.train.checkpoint_every=2"]
  return _pipeline("configs/agent_sft.py:tiny_rl", root, data_cache, sft + RL_STAGE)


# What importing c2jax sets in this process (c2jax._quiet_absent_tpu), which a user's
# shell does not have.
_SET_BY_C2JAX = ("TPU_HOST_BOUNDS", "TPU_WORKER_HOSTNAMES")


def _pipeline(config, root, data_cache, stages, as_user=False):
  """as_user: the environment of a user's shell (no JAX_PLATFORMS, nothing this process
  set by importing c2jax), as the README's command runs; else JAX_PLATFORMS=cpu."""
  data = [arg for arg in TINY if arg.startswith("--config.data.")]  # shared by all stages
  cmd = [sys.executable, "-m", "c2jax.cli", "pipeline", f"--config={config}",
         f"--workdir={root}", f"--config.data.cache_dir={data_cache}", *data, *stages,
         "--config.traces.count=3", "--config.traces.heldout=1"]
  if as_user:
    env = {k: v for k, v in os.environ.items()
           if k != "JAX_PLATFORMS" and k not in _SET_BY_C2JAX}
    # libtpu starts as in a user's lone process even while another test process holds
    # its lock file, when it would skip its start-up, errors and all.
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
  else:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
  result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=900)
  if result.returncode != 0:
    raise AssertionError(f"pipeline failed ({result.returncode}):\n{result.stdout[-3000:]}"
                         f"\n{result.stderr[-3000:]}")
  return result
