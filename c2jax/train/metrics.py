"""Metrics sinks (config.metrics.loggers): WORKDIR/metrics.jsonl (one object per logged
row; always on), TensorBoard events (WORKDIR/tensorboard) and Weights & Biases.

On resume the JSONL file is truncated to the restored step, so it always holds exactly one
loss curve, the one the checkpoints continue. The rows cut off (steps after the restored
checkpoint, which the resumed run discards) are appended to metrics.discarded.jsonl, each
with `discarded_on_resume_from`: what those steps did stays on disk. W&B (the `wandb`
extra: pip install c2jax[wandb]) logs the job's config and every row from process 0; the run's id is kept in
WORKDIR/wandb_run_id, so a restarted job continues the same W&B run (rows carry their
`step` as the x-axis, so the steps a resume repeats are logged again, not refused).
Its settings: config.metrics.wandb (project, entity, name, mode: '' follows WANDB_MODE,
or 'online' | 'offline'; offline runs are uploaded later with `wandb sync WORKDIR/wandb`).
"""

from __future__ import annotations

import json
import math
import pathlib
import time
import uuid

import ml_collections

from c2jax import config as configlib

LOGGERS = ("jsonl", "tensorboard", "wandb")
WANDB_MODES = ("", "online", "offline", "disabled")
RUN_ID_FILE = "wandb_run_id"


def default_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      loggers=("jsonl", "tensorboard"),
      wandb=dict(project="c2jax", entity="", name="", mode="")))


def validate(metrics_cfg, prefix: str = "metrics.") -> None:
  configlib.check_keys(metrics_cfg, default_config(), prefix)
  loggers = tuple(metrics_cfg.loggers)
  unknown = sorted(set(loggers) - set(LOGGERS))
  if unknown:
    raise configlib.ConfigError(f"{prefix}loggers", f"has {unknown}; choose from {LOGGERS}.")
  if "jsonl" not in loggers:
    raise configlib.ConfigError(
        f"{prefix}loggers", f"= {loggers} lacks 'jsonl': resume, sweeps and reports read "
        "WORKDIR/metrics.jsonl; keep it and add the others.")
  configlib.check_choice(metrics_cfg, "wandb.mode", WANDB_MODES)
  if "wandb" in loggers:
    try:
      import wandb  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      raise configlib.ConfigError(
          f"{prefix}loggers", "includes 'wandb' but the wandb package is not installed; "
          "pip install 'c2jax[wandb]' (or drop 'wandb').") from None


class MetricsWriter:

  def __init__(self, workdir: str | pathlib.Path, *, resume_step: int = 0,
               metrics_cfg=None, config: dict | None = None):
    """metrics_cfg: config.metrics (None: jsonl and TensorBoard); config: the job's whole
    config as a dict, recorded by W&B."""
    metrics_cfg = default_config() if metrics_cfg is None else metrics_cfg
    loggers = tuple(metrics_cfg.loggers)
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._truncate_after(resume_step)
    self._file = open(self.path, "a")
    self._tb = None
    self._tb_dir = (str(pathlib.Path(workdir) / "tensorboard") if "tensorboard" in loggers
                    else None)
    self._wandb = None
    if "wandb" in loggers and _is_lead_process():
      self._wandb = _start_wandb(pathlib.Path(workdir), metrics_cfg.wandb, config or {})

  def _truncate_after(self, step: int) -> None:
    if not self.path.exists():
      return
    kept, discarded = [], []
    for line in self.path.read_text().splitlines():
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        continue  # a line cut short by a kill
      if row.get("step", 0) <= step:
        kept.append(line)
      else:
        discarded.append(json.dumps({**row, "discarded_on_resume_from": int(step)}))
    if discarded:  # first, so a kill in between loses nothing
      with open(self.path.with_name("metrics.discarded.jsonl"), "a") as record:
        record.write("".join(line + "\n" for line in discarded))
    self.path.write_text("".join(line + "\n" for line in kept))

  def write(self, step: int, scalars: dict) -> dict:
    row = {"step": int(step), "time": round(time.time(), 3)}
    row.update({k: _plain(v) for k, v in scalars.items()})
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()
    scalars = {key: value for key, value in row.items()
               if key not in ("step", "time") and isinstance(value, (int, float))}
    if self._tb is None and self._tb_dir is not None:
      from tensorboardX import SummaryWriter  # imported lazily: start-up stays fast
      self._tb = SummaryWriter(self._tb_dir)
    if self._tb is not None:
      for key, value in scalars.items():
        self._tb.add_scalar(key, value, step)
    if self._wandb is not None:
      self._wandb.log({"step": int(step), **scalars})
    return row

  def close(self) -> None:
    self._file.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None


def _is_lead_process() -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


def _start_wandb(workdir: pathlib.Path, wandb_cfg, config: dict):
  """A W&B run for this workdir: a new id the first time, the stored one on restarts."""
  import wandb  # pylint: disable=g-import-not-at-top  # the optional `wandb` extra
  id_file = workdir / RUN_ID_FILE
  if id_file.exists():
    run_id = id_file.read_text().strip()
  else:
    run_id = uuid.uuid4().hex[:12]  # W&B ids: letters and digits, unique per project
    id_file.write_text(run_id + "\n")
  run = wandb.init(project=wandb_cfg.project, entity=wandb_cfg.entity or None,
                   name=wandb_cfg.name or workdir.name, id=run_id, resume="allow",
                   dir=str(workdir), config=config, mode=wandb_cfg.mode or None)
  run.define_metric("*", step_metric="step")
  return run


def _plain(value):
  value = value.item() if hasattr(value, "item") else value
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def read_metrics(workdir: str | pathlib.Path) -> list[dict]:
  path = pathlib.Path(workdir) / "metrics.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
