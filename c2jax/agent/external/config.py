"""Defaults and validation of `agent.external`: which external harness drives an episode.

The defaults are the schema of known keys (configlib.check_keys); the harness names come
from the HARNESSES registry.
"""

from __future__ import annotations

import ml_collections

from c2jax import config as configlib
from c2jax.agent.external.launchers import HARNESSES
from c2jax.env import sandbox as sandbox_lib


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # RL actors roll out through the harness below instead of the native agent loop (the
  # native loop's sampling, turn and tool settings then do not apply; these do).
  c.enabled = False
  c.harness = "mini_swe_agent"  # a key of launchers.HARNESSES
  c.command = ""  # 'command' harness: argv template ({base_url} {model} {task_file} {workdir})
  c.timeout_s = 900.0  # the whole episode; past it the harness is killed (finish 'budget')
  c.max_turns = 30  # model calls the harness may make (mini-swe-agent step_limit)
  c.temperature = 1.0
  c.max_tokens = 1024  # per model call
  c.backend = "bubblewrap"  # sandbox the hidden tests run in
  c.grade_timeout_s = 300.0
  c.mini_swe_agent = ml_collections.ConfigDict(dict(
      config="",  # a mini-swe-agent YAML; '' = its own mini.yaml
      environment_class="local",  # where its commands run: local | bubblewrap | docker
      command_timeout_s=60,
      system_template="",  # '' keeps the YAML's
      instance_template="",
  ))
  return c


def validate(cfg: ml_collections.ConfigDict, prefix: str = "agent.external") -> None:
  configlib.check_keys(cfg, default_config(), prefix + ".")
  wrapper = cfg
  for part in reversed(prefix.split(".")):
    wrapper = ml_collections.ConfigDict({part: wrapper})
  configlib.check_choice(wrapper, prefix + ".harness", HARNESSES)
  for name in ("timeout_s", "max_turns", "max_tokens", "grade_timeout_s",
               "mini_swe_agent.command_timeout_s"):
    configlib.check_positive(wrapper, f"{prefix}.{name}")
  configlib.check_choice(wrapper, prefix + ".backend", sandbox_lib.backends())
  if cfg.harness == "command" and not cfg.command:
    raise configlib.ConfigError(prefix + ".command", "is empty; harness 'command' needs an "
                                "argv template such as 'python agent.py {task_file}'.")
