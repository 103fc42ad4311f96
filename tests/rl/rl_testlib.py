"""Helpers shared by the RL actor tests."""

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
