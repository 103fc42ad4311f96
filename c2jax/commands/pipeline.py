"""`c2jax pipeline`: every stage end to end, each resumable (rerun skips finished work).

  c2jax pipeline --config=configs/pipeline.py:tiny --workdir=runs/tiny
"""

from __future__ import annotations

import json
import pathlib
import time

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pipeline config (configs/pipeline.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Root directory; stages go in WORKDIR/<stage>.")

STAGES = ("pretrain", "longctx", "traces", "sft")
TRAINING_STAGES = ("pretrain", "longctx", "sft")


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


def main(argv) -> int:
  if len(argv) > 1:
    raise SystemExit(f"c2jax pipeline: unexpected arguments {argv[1:]}")
  if _CONFIG.value is None or _WORKDIR.value is None:
    raise SystemExit("pass --config=configs/pipeline.py:<variant> and --workdir=DIR")
  from c2jax.train import loop

  cfg, root = _CONFIG.value, pathlib.Path(_WORKDIR.value).expanduser()
  unknown = [stage for stage in cfg.stages if stage not in STAGES]
  if unknown:
    raise SystemExit(f"config.stages: unknown {unknown}; known stages are {STAGES}.")
  undefined = [stage for stage in cfg.stages if stage not in cfg]
  if undefined:
    raise SystemExit(f"config.stages lists {undefined}, but the config has no section for "
                     "them; drop them from config.stages or use a config that defines them.")
  if not 0 < cfg.traces.heldout < cfg.traces.count:
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

  try:  # an undeclared architecture change in a later stage fails before any stage runs
    model_source.check_chain([(stage, cfg[stage]) for stage in trained])
  except ConfigError as err:
    raise SystemExit(f"c2jax pipeline: {err}") from None
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
    else:
      result = loop.train(cfg[stage], workdir)
      evals = result.pop("evals")
      result["eval"] = evals[-1] if evals else None
    result["seconds"] = round(time.time() - start, 1)
    summary[stage] = result
    print(f"=== {stage} done: {json.dumps(result)}", flush=True)
  (root / "summary.json").write_text(json.dumps(summary, indent=2))
  print(f"pipeline: all stages done; summary in {root / 'summary.json'}")
  return 0
