"""Runs one mini-swe-agent episode (a subprocess of c2jax/agent/external/harness.py).

    python mini_swe_runner.py SPEC.json

Run by file path, not as a c2jax module, so the harness process imports mini-swe-agent
and nothing of c2jax (no JAX start-up per episode). SPEC holds: model (litellm name,
e.g. 'openai/tiny@ep-3'), api_base, api_key, model_kwargs, task, cwd, step_limit,
config (a mini-swe-agent YAML, '' for its own mini.yaml), environment_class, command
timeout_s, system_template / instance_template ('' keeps the YAML's), output (its
trajectory JSON) and status (where the exit status is written).
"""

import json
import sys
from pathlib import Path


def build_config(spec: dict) -> dict:
  from minisweagent.config import builtin_config_dir, get_config_from_spec  # pylint: disable=import-outside-toplevel
  from minisweagent.utils.serialize import recursive_merge  # pylint: disable=import-outside-toplevel

  base = get_config_from_spec(spec["config"] or builtin_config_dir / "mini.yaml")
  agent = {"agent_class": "default", "step_limit": spec["step_limit"], "cost_limit": 0,
           "output_path": spec["output"], "mode": None}
  for key in ("system_template", "instance_template"):
    if spec[key]:
      agent[key] = spec[key]
  overrides = {
      "agent": agent,
      "model": {"model_class": "litellm", "model_name": spec["model"],
                "cost_tracking": "ignore_errors",
                "model_kwargs": {"api_base": spec["api_base"], "api_key": spec["api_key"],
                                 **spec["model_kwargs"]}},
      "environment": {"environment_class": spec["environment_class"], "cwd": spec["cwd"],
                      "timeout": spec["timeout_s"]},
  }
  config = recursive_merge(base, overrides)
  config["agent"] = {k: v for k, v in config["agent"].items() if k != "mode"}
  return config


def main(path: str) -> int:
  spec = json.loads(Path(path).read_text())
  from minisweagent.agents import get_agent  # pylint: disable=import-outside-toplevel
  from minisweagent.environments import get_environment  # pylint: disable=import-outside-toplevel
  from minisweagent.models import get_model  # pylint: disable=import-outside-toplevel

  config = build_config(spec)
  config["agent"]["output_path"] = Path(config["agent"]["output_path"])
  model = get_model(config=config["model"])
  env = get_environment(config["environment"], default_type="local")
  agent = get_agent(model, env, config["agent"], default_type="default")
  status = "error"
  try:
    result = agent.run(spec["task"])
    status = result.get("exit_status", "") or "unknown"
  finally:
    Path(spec["status"]).write_text(status)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1]))
