"""The pipeline: a config's stages in order, each resumable, every result in one summary.

    summary = pipeline.run(cfg, root)   # `c2jax pipeline --config=... --workdir=ROOT`

The stages, in this order (a config lists those it runs in `stages`):
  pretrain, longctx  training jobs (c2jax.train.loop), each started from the one before it
  traces             agent traces for SFT: procedural tasks solved through the real tools,
                     split into train / held-out JSONL
  sft                a training job on those traces
  rl                 an RL job config (configs/rl.py) started from the last training stage,
                     run exactly as `c2jax rl` runs it (c2jax.rl.trainer.train)
  eval               an eval job config (configs/eval.py, any suite) scored by the engine
                     policy on the last trained stage's run (rl's, when the pipeline has
                     rl), run exactly as `c2jax eval` runs it (c2jax.eval.runner.run)
Every stage works in ROOT/<stage>; one shared `data` section (corpus and tokenizer) is
copied into each job. A finished stage records its result in ROOT/<stage>/RESULT with what
it was run to (steps, suite, ...); a rerun reports that recorded result instead of running
the stage again, and a stage whose target changed (e.g. more steps) continues from where it
stopped. ROOT/summary.json holds every stage's result, rewritten after each stage.
SIGTERM or SIGINT stops the stage in flight the way its own command stops (a checkpoint of
the step it was on): the pipeline then records nothing for that stage, starts no other,
marks ROOT as preempted (c2jax.preemption) and returns; rerunning resumes that stage.
"""

from __future__ import annotations

import json
import pathlib
import time

from c2jax import config as configlib
from c2jax import preemption
from c2jax.agent import solver
from c2jax.env import procgen
from c2jax.env import tasks as tasks_lib
from c2jax.eval import runner as eval_runner
from c2jax.rl import job as rl_job
from c2jax.rl import trainer as rl_trainer
from c2jax.train import loop
from c2jax.train import model_source

STAGES = ("pretrain", "longctx", "traces", "sft", "rl", "eval")
TRAINING_STAGES = ("pretrain", "longctx", "sft")
# Stages that may only come at the end, in this order: nothing trains from rl, and eval
# scores the last trained run.
FINAL_STAGES = ("rl", "eval")
# A finished stage's result and target (ROOT/<stage>/RESULT): a rerun reports it.
RESULT = "pipeline_result.json"
SUMMARY = "summary.json"


def build_traces(cfg, workdir: pathlib.Path) -> dict:
  """Procedural tasks solved through the tools, split into train / held-out JSONL."""
  train_path, heldout_path = workdir / "train.jsonl", workdir / "heldout.jsonl"
  if not (train_path.exists() and heldout_path.exists()):
    suite = procgen.generate_suite(str(workdir / "repos"), cfg.count, cfg.seed,
                                   tuple(cfg.difficulties))
    traces = solver.solve_suite(suite, cfg.backend, tuple(cfg.tools))
    tasks_lib.save_jsonl(suite, str(workdir / "tasks.jsonl"))
    for path, rows in ((heldout_path, traces[:cfg.heldout]),
                       (train_path, traces[cfg.heldout:])):
      _write_json_lines(path, rows)
  return {"train_traces": len(train_path.read_text().splitlines()),
          "heldout_traces": len(heldout_path.read_text().splitlines())}


def prepare(cfg, root: pathlib.Path) -> None:
  """Checks the config as a chain and points each stage at the one before it under `root`
  (init_from, the shared data section, SFT's trace files, the evaluated run). Raises
  ConfigError naming the key, before any stage runs."""
  unknown = [stage for stage in cfg.stages if stage not in STAGES]
  if unknown:
    raise configlib.ConfigError("stages", f"unknown {unknown}; known stages are {STAGES}.")
  undefined = [stage for stage in cfg.stages if stage not in cfg]
  if undefined:
    raise configlib.ConfigError(
        "stages", f"lists {undefined}, but the config has no section for them; drop them "
        "from config.stages or use a config that defines them.")
  final = tuple(stage for stage in FINAL_STAGES if stage in cfg.stages)
  if final and tuple(cfg.stages[-len(final):]) != final:
    raise configlib.ConfigError(
        "stages", f"= {tuple(cfg.stages)}: {' and '.join(FINAL_STAGES)} must come last, in "
        "that order (rl starts from the last training stage and nothing trains from it; "
        "eval scores the last trained run).")
  if "traces" in cfg and not 0 < cfg.traces.heldout < cfg.traces.count:
    raise configlib.ConfigError(
        "traces.heldout", f"= {cfg.traces.heldout} must be > 0 and < config.traces.count = "
        f"{cfg.traces.count}.")
  # The training stages this config defines, in pipeline order: each starts from the one
  # before it under this root; the first keeps its config's init_from ("" = from scratch).
  trained = [stage for stage in TRAINING_STAGES if stage in cfg]
  for stage in trained:
    cfg[stage].data = cfg.data
  for previous, stage in zip(trained, trained[1:]):
    cfg[stage].init_from = str(root / previous)
  # An undeclared architecture change in a later stage fails before any stage runs.
  chain = [(stage, cfg[stage]) for stage in trained]
  if "rl" in cfg.stages:
    _point_rl(cfg, root, trained)
    chain.append(("rl", cfg.rl))
  resolved = model_source.check_chain(chain)
  if "rl" in cfg.stages:
    _named(rl_job.validate, "rl", resolved[-1])
  if "eval" in cfg.stages:
    _point_eval(cfg, root, trained + ["rl"] * ("rl" in cfg.stages))
    _named(eval_runner.validate, "eval", cfg.eval)
  if "sft" in cfg and "traces" in cfg:
    cfg.sft.sft.train_path = str(root / "traces" / "train.jsonl")
    cfg.sft.sft.heldout_path = str(root / "traces" / "heldout.jsonl")


def run(cfg, root: str | pathlib.Path) -> dict:
  """Runs (or resumes, or reports) every stage of `cfg.stages` under `root`; returns the
  summary, also written to ROOT/summary.json."""
  root = pathlib.Path(root).expanduser().absolute()
  prepare(cfg, root)
  preemption.clear(root)
  summary = {}
  for stage in cfg.stages:
    workdir = root / stage
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"=== {stage} -> {workdir}", flush=True)
    target = _target(cfg, stage, summary)
    result = _recorded(workdir, target)
    if result is not None:
      print(f"{stage}: finished ({_describe(target)}); recorded result from "
            f"{workdir / RESULT}", flush=True)
    else:
      start = time.time()
      result = _run_stage(cfg, stage, workdir)
      result["seconds"] = round(time.time() - start, 1)
      if result.get("preempted"):
        # Stopped by SIGTERM/SIGINT: not finished, so no record and no next stage; the
        # stage resumes from its checkpoint when the same command is rerun.
        summary[stage] = result
        _write_json(root / SUMMARY, summary)
        preemption.mark(root, stage=stage)
        print(f"preemption: the pipeline stopped in stage {stage}; rerun the same command "
              "to resume", flush=True)
        return {**summary, "preempted": stage}
      _write_json(workdir / RESULT, {"target": target, "result": result})
    summary[stage] = result
    print(f"=== {stage} done: {json.dumps(result, default=float)}", flush=True)
    _write_json(root / SUMMARY, summary)
  print(f"pipeline: all stages done; summary in {root / SUMMARY}", flush=True)
  return summary


def _run_stage(cfg, stage: str, workdir: pathlib.Path) -> dict:
  if stage == "traces":
    return build_traces(cfg.traces, workdir)
  if stage == "rl":
    summary = rl_trainer.train(cfg.rl, str(workdir))
    evals = {int(step): row for step, row in summary["evals"].items()}
    return {"step": summary["step"], "init_from": cfg.rl.init_from,
            # The held-out pass rate (and best-of-k) of the last evaluation, and every one.
            "eval": evals[max(evals)] if evals else None,
            "evals": {str(step): evals[step] for step in sorted(evals)},
            "idle_fraction": summary["idle_fraction"], "preempted": summary["preempted"]}
  if stage == "eval":
    summary = _named(eval_runner.run, "eval", cfg.eval, str(workdir))
    overall = summary["overall"]
    result = {"suite": summary["suite"], "run": cfg.eval.policy.run,
              "eval": {k: v for k, v in overall.items() if not isinstance(v, (dict, list))},
              "preempted": bool(summary.get("preempted"))}
    if "metrics" in summary:  # a scored suite's own numbers (perplexity, ...)
      result["metrics"] = summary["metrics"]
    return result
  result = loop.train(cfg[stage], workdir)
  evals = result.pop("evals")
  result["eval"] = evals[-1] if evals else None
  return result


def _target(cfg, stage: str, summary: dict) -> dict:
  """What a finished stage was run to: a recorded result counts only for the same target."""
  if stage in TRAINING_STAGES:
    return {"steps": cfg[stage].train.steps}
  if stage == "rl":
    return {"steps": cfg.rl.learner.steps}
  if stage == "traces":
    return json.loads(json.dumps(cfg.traces.to_dict(), default=list))
  # The scored run's step: from this run's summary, or the stage's record when the stage
  # is not listed in this run's stages.
  run_dir = pathlib.Path(cfg.eval.policy.run)
  scored = summary.get(run_dir.name) or _recorded_result(run_dir)
  return {"suite": json.loads(json.dumps(cfg.eval.suite.to_dict(), default=list)),
          "samples": cfg.eval.eval.samples, "ks": list(cfg.eval.eval.ks),
          "run": {"stage": run_dir.name, "step": _trained_step(scored) if scored else None}}


def _recorded_result(workdir: pathlib.Path) -> dict | None:
  path = workdir / RESULT
  return json.loads(path.read_text()).get("result") if path.exists() else None


def _recorded(workdir: pathlib.Path, target: dict) -> dict | None:
  path = workdir / RESULT
  if not path.exists():
    return None
  record = json.loads(path.read_text())
  if record.get("target") == target:
    return record["result"]
  before = record.get("target", {}).get("run")
  if before and before != target.get("run"):
    # The eval runner resumes the results in its workdir: scores of another checkpoint
    # would be mixed into this one's.
    raise configlib.ConfigError(
        "eval", f"{workdir} holds scores of {before['stage']} at step {before['step']}, but "
        f"that run is now at step {target['run']['step']}; move {workdir} away to score "
        "the new checkpoint.")
  return None


def _describe(target: dict) -> str:
  if "steps" in target:
    return f"step {target['steps']}"
  if "run" in target:
    return f"{target['run']['stage']} at step {target['run']['step']}"
  return "same settings"


def _trained_step(result: dict) -> int:
  return result["steps"] if "steps" in result else result["step"]


def _point_rl(cfg, root: pathlib.Path, trained: list[str]) -> None:
  """Points the rl section at the chain: the last training stage's run under `root` and
  the shared data section (its tokenizer). Raises ConfigError for an rl section that
  cannot continue this chain."""
  rl = cfg.rl
  if not hasattr(rl, "get") or rl.get("task") != "rl":
    raise configlib.ConfigError(
        "rl", "is not an RL job config (one with task = 'rl'); load it from configs/rl.py, "
        "e.g. configlib.load_config_file(HERE / 'rl.py', variant).")
  if not trained:
    raise configlib.ConfigError(
        "rl", f"has no training stage to start from: the config defines none of "
        f"{TRAINING_STAGES}; RL continues the pipeline's last trained checkpoint.")
  _check_agent_matches_traces(cfg, "rl")
  rl.data = cfg.data
  rl.init_from = str(root / trained[-1])


def _point_eval(cfg, root: pathlib.Path, trained: list[str]) -> None:
  """Points the eval section's engine policy at the last trained stage's run."""
  section = cfg.eval
  if not hasattr(section, "get") or not all(key in section for key in
                                            ("suite", "policy", "agent", "eval")):
    raise configlib.ConfigError(
        "eval", "is not an eval job config (suite, policy, agent, eval sections); load it "
        "from configs/eval.py, e.g. configlib.load_config_file(HERE / 'eval.py', "
        "'procgen,tiny').")
  if not trained:
    raise configlib.ConfigError(
        "eval", f"has no trained stage to score: the config defines none of "
        f"{TRAINING_STAGES + ('rl',)}.")
  if section.policy.kind != "engine":
    raise configlib.ConfigError(
        "eval.policy.kind", f"is {section.policy.kind!r}; the pipeline's eval stage scores "
        "its own last trained run with the engine policy: set it to 'engine'.")
  _check_agent_matches_traces(cfg, "eval")
  section.policy.run = str(root / trained[-1])


def _check_agent_matches_traces(cfg, stage: str) -> None:
  """The SFT traces show the system message of their tool list and call format: an agent
  stage after them must prompt with the same ones."""
  if "traces" not in cfg:
    return
  agent = cfg[stage].agent
  if tuple(cfg.traces.tools) != tuple(agent.tools):
    raise configlib.ConfigError(
        f"{stage}.agent.tools", f"= {tuple(agent.tools)} differs from config.traces.tools "
        f"= {tuple(cfg.traces.tools)}: the SFT traces show another system message than the "
        f"{stage} prompts would; use the same tool list in both.")
  if "sft" in cfg and cfg.sft.sft.tool_format != agent.tool_format:
    raise configlib.ConfigError(
        f"{stage}.agent.tool_format", f"= {agent.tool_format!r} differs from "
        f"config.sft.sft.tool_format = {cfg.sft.sft.tool_format!r}: the policy was "
        "trained on the other call format.")


def _named(fn, section: str, *args):
  """fn(*args), its ConfigError keyed under the pipeline's section (e.g. `eval.suite.name`)."""
  try:
    return fn(*args)
  except configlib.ConfigError as err:
    raise configlib.ConfigError(f"{section}.{err.key}", str(err).split(": ", 1)[1]) from None


def _write_json(path: pathlib.Path, value) -> None:
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(value, indent=2, default=float))
  tmp.rename(path)  # a killed run never leaves a half-written file behind


def _write_json_lines(path: pathlib.Path, rows) -> None:
  tmp = path.with_suffix(".tmp")
  tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
  tmp.rename(path)
