"""The external harnesses c2jax can launch, by name (HARNESSES), and what each is given.

A harness is a function (cfg, Launch) -> (argv, extra env) for one episode's subprocess
(harness.py runs it, stitches its captured requests and grades the result):
  mini_swe_agent  mini-swe-agent's DefaultAgent with its litellm model (mini_swe_runner.py)
  command         cfg.command, an argv template; {base_url} {model} {task_file} {workdir}
                  are filled in, and OPENAI_BASE_URL / OPENAI_API_KEY / C2JAX_MODEL (and
                  C2JAX_SEED) are set
The registry knows no agent loop, so the agent.external config validates against it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Launch:
  """What a harness needs to start one episode."""
  base_url: str  # ends in /v1
  model: str  # '<served name>@<episode tag>'
  workdir: str  # the repository copy the agent works in
  task_file: str  # the task prompt, as a file
  out_dir: str  # harness-private files (its own transcript, exit status)
  seed: int | None = None  # the sampling seed the harness should send, if it can


def _mini_swe_agent(cfg, launch: Launch) -> tuple[list[str], dict[str, str]]:
  spec = {
      "model": "openai/" + launch.model, "api_base": launch.base_url, "api_key": "c2jax",
      "model_kwargs": {"temperature": cfg.temperature, "max_tokens": cfg.max_tokens,
                       **({} if launch.seed is None else {"seed": launch.seed})},
      "task": open(launch.task_file, encoding="utf-8").read(), "cwd": launch.workdir,
      "step_limit": cfg.max_turns, "config": cfg.mini_swe_agent.config,
      "environment_class": cfg.mini_swe_agent.environment_class,
      "timeout_s": cfg.mini_swe_agent.command_timeout_s,
      "system_template": cfg.mini_swe_agent.system_template,
      "instance_template": cfg.mini_swe_agent.instance_template,
      "output": os.path.join(launch.out_dir, "mini.traj.json"),
      "status": os.path.join(launch.out_dir, "status"),
  }
  path = os.path.join(launch.out_dir, "spec.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(spec, f)
  runner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mini_swe_runner.py")
  # No telemetry / first-run prompt / network model-cost lookups from litellm.
  env = {"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors",
         "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_GLOBAL_CONFIG_DIR": launch.out_dir}
  return [sys.executable, runner, path], env


def _command(cfg, launch: Launch) -> tuple[list[str], dict[str, str]]:
  if not cfg.command:
    raise ValueError("agent.external.harness = 'command' needs agent.external.command, an "
                     "argv template such as 'python my_agent.py --task {task_file}'.")
  fields = dataclasses.asdict(launch)
  try:
    argv = [part.format(**fields) for part in shlex.split(cfg.command)]
  except (KeyError, IndexError, ValueError) as e:
    names = " ".join("{" + name + "}" for name in fields)
    raise ValueError(f"agent.external.command = {cfg.command!r}: bad placeholder ({e}); "
                     f"the placeholders are {names}; double literal braces.") from e
  env = {"OPENAI_BASE_URL": launch.base_url, "OPENAI_API_KEY": "c2jax",
         "C2JAX_MODEL": launch.model}
  if launch.seed is not None:
    env["C2JAX_SEED"] = str(launch.seed)
  return argv, env


HARNESSES: dict[str, Callable] = {"mini_swe_agent": _mini_swe_agent, "command": _command}
