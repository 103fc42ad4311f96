"""`c2jax pipeline`: every stage end to end, each resumable (rerun skips finished work).

  c2jax pipeline --config=configs/pipeline.py:tiny --workdir=runs/tiny
  c2jax pipeline --config=configs/agent_sft.py:tiny_rl --workdir=runs/tiny_agent   # ... -> RL

The stages, in this order (a config lists those it runs in `stages`): pretrain, longctx
(training jobs), traces (agent traces for SFT), sft, and rl: an RL job config (configs/rl.py)
started from the last training stage under the same root, run exactly as `c2jax rl` runs
it (c2jax.rl.trainer.train), always last. Every stage's result lands in WORKDIR/summary.json.
"""

from __future__ import annotations

import json
import pathlib
import time

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pipeline config (configs/pipeline.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Root directory; stages go in WORKDIR/<stage>.")

STAGES = ("pretrain", "longctx", "traces", "sft", "rl")
TRAINING_STAGES = ("pretrain", "longctx", "sft")
# What the pipeline keeps of a finished RL stage (WORKDIR/rl/RL_RESULT): a rerun reuses it
# instead of starting the actors again.
RL_RESULT = "pipeline_result.json"


def build_traces(cfg, workdir: pathlib.Path) -> dict:
  """Procedural tasks solved through the tools, split into train / held-out JSONL."""
  from c2jax.agent import solver
  from c2jax.env import procgen
  from c2jax.env import tasks as tasks_lib

  train_path, heldout_path = workdir / "train.jsonl", workdir / "heldout.jsonl"
  if not (train_path.exists() and heldout_path.exists()):
    suite = procgen.generate_suite(str(workdir / "repos"), cfg.count, cfg.seed,
                                   tuple(cfg.difficulties))
    traces = solver.solve_suite(suite, cfg.backend, tuple(cfg.tools))
    tasks_lib.save_jsonl(suite, str(workdir / "tasks.jsonl"))
    for path, rows in ((heldout_path, traces[:cfg.heldout]),
                       (train_path, traces[cfg.heldout:])):
      tmp = path.with_suffix(".tmp")
      tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
      tmp.rename(path)  # a killed run never leaves a half-written trace file behind
  return {"train_traces": len(train_path.read_text().splitlines()),
          "heldout_traces": len(heldout_path.read_text().splitlines())}


def check_rl_section(cfg, root: pathlib.Path, trained: list[str]) -> None:
  """Points the rl section at the chain: the last training stage's run under `root` and
  the shared data section (its tokenizer). Raises ConfigError for an rl section that
  cannot continue this chain."""
  from c2jax import config as configlib

  rl = cfg.rl
  if not hasattr(rl, "get") or rl.get("task") != "rl":
    raise configlib.ConfigError(
        "rl", "is not an RL job config (one with task = 'rl'); load it from configs/rl.py, "
        "e.g. configlib.load_config_file(HERE / 'rl.py', variant).")
  if cfg.stages[-1] != "rl":
    raise configlib.ConfigError(
        "stages", f"= {tuple(cfg.stages)}: 'rl' must come last (it starts from the last "
        "training stage and nothing continues from it).")
  if not trained:
    raise configlib.ConfigError(
        "rl", f"has no training stage to start from: the config defines none of "
        f"{TRAINING_STAGES}; RL continues the pipeline's last trained checkpoint.")
  if "traces" in cfg:  # SFT rendered its traces with these tools: RL prompts must match
    if tuple(cfg.traces.tools) != tuple(rl.agent.tools):
      raise configlib.ConfigError(
          "rl.agent.tools", f"= {tuple(rl.agent.tools)} differs from config.traces.tools = "
          f"{tuple(cfg.traces.tools)}: the SFT traces show another system message than the "
          "RL prompts would; use the same tool list in both.")
    if "sft" in cfg and cfg.sft.sft.tool_format != rl.agent.tool_format:
      raise configlib.ConfigError(
          "rl.agent.tool_format", f"= {rl.agent.tool_format!r} differs from "
          f"config.sft.sft.tool_format = {cfg.sft.sft.tool_format!r}: the policy was "
          "trained on the other call format.")
  rl.data = cfg.data
  rl.init_from = str(root / trained[-1])


def run_rl(rl_cfg, workdir: pathlib.Path) -> dict:
  """The rl stage: `c2jax rl`'s own trainer, or the recorded result of a finished run."""
  from c2jax.rl import trainer
  from c2jax.rl.actors import backends as actors

  done = workdir / RL_RESULT
  if done.exists():
    result = json.loads(done.read_text())
    if result.get("step") == rl_cfg.learner.steps:
      print(f"rl: finished at step {result['step']}; result from {done}", flush=True)
      return result
  try:
    summary = trainer.train(rl_cfg, str(workdir))
  except actors.ActorFailure as err:
    raise SystemExit(f"c2jax pipeline: rl stage: {err}") from None
  evals = {int(step): row for step, row in summary["evals"].items()}
  result = {"step": summary["step"], "init_from": rl_cfg.init_from,
            # The held-out pass rate (and best-of-k) of the last evaluation, and every one.
            "eval": evals[max(evals)] if evals else None,
            "evals": {str(step): evals[step] for step in sorted(evals)},
            "idle_fraction": summary["idle_fraction"]}
  tmp = done.with_suffix(".tmp")
  tmp.write_text(json.dumps(result, indent=2, default=float))
  tmp.rename(done)
  return result


def main(argv) -> int:
  if len(argv) > 1:
    raise SystemExit(f"c2jax pipeline: unexpected arguments {argv[1:]}")
  if _CONFIG.value is None or _WORKDIR.value is None:
    raise SystemExit("pass --config=configs/pipeline.py:<variant> and --workdir=DIR")
  from c2jax.train import loop

  cfg, root = _CONFIG.value, pathlib.Path(_WORKDIR.value).expanduser().absolute()
  unknown = [stage for stage in cfg.stages if stage not in STAGES]
  if unknown:
    raise SystemExit(f"config.stages: unknown {unknown}; known stages are {STAGES}.")
  undefined = [stage for stage in cfg.stages if stage not in cfg]
  if undefined:
    raise SystemExit(f"config.stages lists {undefined}, but the config has no section for "
                     "them; drop them from config.stages or use a config that defines them.")
  if "traces" in cfg and not 0 < cfg.traces.heldout < cfg.traces.count:
    raise SystemExit(f"config.traces.heldout = {cfg.traces.heldout} must be > 0 and < "
                     f"config.traces.count = {cfg.traces.count}.")
  # The training stages this config defines, in pipeline order: each starts from the one
  # before it under this root; the first keeps its config's init_from ("" = from scratch).
  trained = [stage for stage in TRAINING_STAGES if stage in cfg]
  for stage in trained:
    cfg[stage].data = cfg.data
  for previous, stage in zip(trained, trained[1:]):
    cfg[stage].init_from = str(root / previous)
  from c2jax.config import ConfigError
  from c2jax.train import model_source

  chain = [(stage, cfg[stage]) for stage in trained]
  try:  # an undeclared architecture change in a later stage fails before any stage runs
    if "rl" in cfg.stages:
      check_rl_section(cfg, root, trained)
      chain.append(("rl", cfg.rl))
    resolved = model_source.check_chain(chain)
    if "rl" in cfg.stages:
      from c2jax.rl import job as rl_job

      try:
        rl_job.validate(resolved[-1])
      except ConfigError as err:
        raise ConfigError(f"rl.{err.key}", str(err).split(": ", 1)[1]) from None
  except ConfigError as err:
    raise SystemExit(f"c2jax pipeline: {err}") from None
  if "sft" in cfg and "traces" in cfg:
    cfg.sft.sft.train_path = str(root / "traces" / "train.jsonl")
    cfg.sft.sft.heldout_path = str(root / "traces" / "heldout.jsonl")
  summary = {}
  for stage in cfg.stages:
    workdir = root / stage
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"=== {stage} -> {workdir}", flush=True)
    start = time.time()
    if stage == "traces":
      result = build_traces(cfg.traces, workdir)
    elif stage == "rl":
      result = run_rl(cfg.rl, workdir)
    else:
      result = loop.train(cfg[stage], workdir)
      evals = result.pop("evals")
      result["eval"] = evals[-1] if evals else None
    result["seconds"] = round(time.time() - start, 1)
    summary[stage] = result
    print(f"=== {stage} done: {json.dumps(result, default=float)}", flush=True)
  (root / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
  print(f"pipeline: all stages done; summary in {root / 'summary.json'}")
  return 0
