"""Helpers shared by the RL tests."""

import pathlib

import numpy as np

from c2jax.env import tasks as tasks_lib
from c2jax.rl import job
from c2jax.rl.actors import rollouts


def flag_task_run(tmp_path):
  """(cfg, task, dirs, pool, queue): a run directory whose pool holds one task (set DONE
  to True in pkg/flag.py), groups of 2, one infra retry and one prompt return."""
  cfg = job.job_defaults("tiny")
  cfg.rl.group_size = 2
  cfg.rl.infra.retries, cfg.rl.infra.prompt_returns = 1, 1
  repo = tmp_path / "repo"
  (repo / "pkg").mkdir(parents=True)
  (repo / "pkg" / "flag.py").write_text("DONE = False\n")
  task = tasks_lib.Task(id="flag", repo=str(repo), prompt="Set DONE to True in pkg/flag.py.",
                        test_command="grep -q 'DONE = True' pkg/flag.py",
                        fail_to_pass=["flag"])
  dirs = rollouts.RunDirs(tmp_path / "run")
  pool, queue = dirs.pool(), dirs.queue(cfg)
  pool.add([(task.id, {"task": task.to_json()})])
  return cfg, task, dirs, pool, queue


def random_segment(model_cfg, rng: np.random.Generator, length: int) -> dict:
  """One trajectory segment of `length` tokens as an actor stores it: random tokens and
  expert choices (for model_cfg's MoE layers), generated (loss_mask) from length // 3 on
  with sampler log-probs in (-3, -2] there and -2 elsewhere, policy version 0."""
  layers = model_cfg.num_layers - model_cfg.first_k_dense
  k, experts = model_cfg.moe.num_experts_per_tok, model_cfg.moe.num_experts
  mask = (np.arange(length) >= length // 3).astype(np.int32)
  return dict(tokens=rng.integers(1, model_cfg.vocab_size, length).astype(np.int32),
              valid=np.ones(length, np.int32), loss_mask=mask,
              sampler_logprobs=(-2.0 - rng.random(length) * mask).astype(np.float32),
              versions=np.zeros(length, np.int32),
              router_indices=rng.integers(0, experts, (length, layers, k)).astype(np.int32))


def actor_pids(workdir) -> list[int]:
  """Pids of the local actor processes of the `c2jax rl` run in `workdir`. An actor's own
  fork (a sandbox command between fork and exec) carries the same command line for a
  moment; it is left out by its parent, a matching process."""
  parents = {}
  for proc in pathlib.Path("/proc").iterdir():
    try:
      cmdline = (proc / "cmdline").read_bytes().split(b"\0")
      # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after ')'.
      ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      continue
    if b"c2jax.rl.actors.actor" in cmdline and f"--workdir={workdir}".encode() in cmdline:
      parents[int(proc.name)] = ppid
  return sorted(pid for pid, ppid in parents.items() if ppid not in parents)
