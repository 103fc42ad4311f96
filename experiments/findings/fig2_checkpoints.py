"""Fig. 2's compute levels from existing training runs (fig2_cpt_to_rl.py --from-checkpoints).

A level is a run directory whose newest checkpoint is the level: its step, its compute
(6 x active parameters x tokens trained to that step), its training loss at that step and
its held-out loss (from its metrics.jsonl or --metrics RUN's, else computed now by the
training loop's own eval on the run's held-out traces).
"""

from __future__ import annotations

import json
import pathlib

from experiments.findings import common


def _checkpoint_step(run) -> int:
  common.check_init_from(run)
  return max(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())


def _saved_section(cfg, saved: dict, where: str) -> None:
  """Sets the saved values (config.json: tuples came back as lists) on `cfg`."""
  for key, value in saved.items():
    if key not in cfg:
      raise SystemExit(f"{where}: {key!r} is not a key of this version's config.")
    if isinstance(value, dict):
      _saved_section(cfg[key], value, f"{where}.{key}")
    else:
      cfg[key] = tuple(value) if isinstance(cfg[key], tuple) else value


def checkpoint_job(args, run):
  """The SFT job config `run` trained with (its config.json over configs/agent_sft.py's
  sft section), its model resolved from the run's own checkpoint."""
  from c2jax.train import model_source  # pylint: disable=g-import-not-at-top

  saved_path = run / "config.json"
  if not saved_path.exists():
    raise SystemExit(f"--from-checkpoints: {saved_path} does not exist; each entry must be "
                     "a training run directory (config.json, checkpoints/).")
  saved = json.loads(saved_path.read_text())
  cfg = common.load_config("agent_sft.py", args.variant).sft
  cfg.task = saved.get("task", cfg.task)  # sft, or pretrain: its held-out corpus then
  for section in ("data", "train", "sft"):
    if section in saved:
      _saved_section(cfg[section], saved[section], f"{saved_path}: {section}")
  cfg.init_from = str(run)
  # e.g. --set sft.sft.heldout_path=... where the run's relative trace paths moved
  common.apply(cfg, args.parsed_overrides.get("sft", {}), "sft")
  return model_source.resolve(cfg, log=False)


def computed_heldout_loss(cfg, run, step: int) -> float:
  """The held-out loss of `run`'s newest checkpoint, by the training loop's eval."""
  from c2jax.train import checkpoint as checkpoint_lib  # pylint: disable=g-import-not-at-top
  from c2jax.train import jobs, loop  # pylint: disable=g-import-not-at-top

  for key in ("train_path", "heldout_path") if cfg.task == "sft" else ():
    if not pathlib.Path(cfg.sft[key]).expanduser().exists():
      raise SystemExit(
          f"{run}: its config.json names sft.{key} = {cfg.sft[key]}, which does not exist "
          "from here; run from the directory the SFT ran in, or pass "
          f"--set sft.sft.{key}=PATH.")
  rt = loop.build_runtime(cfg)
  ckpt = checkpoint_lib.Checkpointer(run / "checkpoints", keep=cfg.train.keep_checkpoints,
                                     every=cfg.train.checkpoint_every)
  try:
    with rt.scope():
      restored = ckpt.restore_latest(loop.abstract_state(rt))
  finally:
    ckpt.close()
  if restored is None or restored[0] != step:
    raise SystemExit(f"{run}: could not restore the checkpoint of step {step}.")
  row = loop.run_evals(rt, loop.make_eval_step(rt), restored[1].params, jobs.datasets(cfg),
                       step)
  if "eval_loss" not in row:
    raise SystemExit(f"{run}: its held-out traces ({cfg.sft.heldout_path}) gave no eval loss.")
  return float(row["eval_loss"])


def checkpoint_level(args, run) -> dict:
  """One compute level from an existing run: its step, compute and losses at that step."""
  from c2jax.model import counting  # pylint: disable=g-import-not-at-top

  step = _checkpoint_step(run)
  cfg = checkpoint_job(args, run)
  # The run's own metrics, else --metrics (the full run's, when RUN is a copy of it at a step).
  source = run if (run / "metrics.jsonl").exists() else args.metrics
  rows = ([r for r in common.metrics_rows(source) if r.get("step") == step]
          if source is not None else [])
  train_loss = [r["loss"] for r in rows if isinstance(r.get("loss"), (int, float))]
  eval_loss = [r["eval_loss"] for r in rows if isinstance(r.get("eval_loss"), (int, float))]
  if eval_loss:
    heldout, source = float(eval_loss[-1]), "metrics"
  else:
    print(f"fig2: {run} logged no eval_loss at step {step}; computing it", flush=True)
    heldout, source = computed_heldout_loss(cfg, run, step), "computed"
  tokens = step * cfg.train.batch_size * cfg.train.seq_len
  active = counting.count_params(cfg.model)["active_params"]
  return {"cpt_steps": step, "cpt_tokens": tokens, "cpt_compute": 6.0 * active * tokens,
          "cpt_loss": float(train_loss[-1]) if train_loss else float("nan"),
          "sft_loss": heldout, "sft_loss_source": source, "cpt_run": str(run),
          "sft_run": str(run), "data": cfg.data}
