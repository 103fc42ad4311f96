"""Metrics sinks: WORKDIR/metrics.jsonl (one object per logged row) and TensorBoard events.

On resume the JSONL file is truncated to the restored step, so it always holds exactly one
loss curve, the one the checkpoints continue. The rows cut off (steps after the restored
checkpoint, which the resumed run discards) are appended to metrics.discarded.jsonl, each
with `discarded_on_resume_from`: what those steps did stays on disk.
"""

from __future__ import annotations

import json
import math
import pathlib
import time


class MetricsWriter:

  def __init__(self, workdir: str | pathlib.Path, *, resume_step: int = 0):
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._truncate_after(resume_step)
    self._file = open(self.path, "a")
    self._tb = None
    self._tb_dir = str(pathlib.Path(workdir) / "tensorboard")

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
    if self._tb is None:
      from tensorboardX import SummaryWriter  # imported lazily: start-up stays fast
      self._tb = SummaryWriter(self._tb_dir)
    for key, value in row.items():
      if key not in ("step", "time") and isinstance(value, (int, float)):
        self._tb.add_scalar(key, value, step)
    return row

  def close(self) -> None:
    self._file.close()
    if self._tb is not None:
      self._tb.close()


def _plain(value):
  value = value.item() if hasattr(value, "item") else value
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def read_metrics(workdir: str | pathlib.Path) -> list[dict]:
  path = pathlib.Path(workdir) / "metrics.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
