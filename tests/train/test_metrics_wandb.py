"""Weights & Biases as a metrics logger, offline: the config and every row are in the run's
own transaction log, and a restarted job continues the same run id."""

import json
import pathlib
import struct
import time

import pytest
from google.protobuf.message import DecodeError
from wandb.proto import wandb_internal_pb2

from c2jax import config as configlib
from c2jax.train import metrics

_BLOCK = 32768  # the log's block size; records never straddle a block's last 6 bytes
_HEADER = 7     # ':W&B', a 2-byte magic and a version byte


def read_wandb_log(path: pathlib.Path):
  """The Record protos of an offline run's .wandb file (W&B's LevelDB-style log: per
  chunk a crc32, a 2-byte length and a type: 1 full, 2 first, 3 middle, 4 last)."""
  data = path.read_bytes()
  assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
  pos, chunks = _HEADER, []
  while pos + 7 <= len(data):
    left = _BLOCK - pos % _BLOCK
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if left < 7 or (kind == 0 and length == 0):  # a block's zero-filled tail
      pos += left
      continue
    chunks.append(data[pos + 7:pos + 7 + length])
    pos += 7 + length
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(b"".join(chunks))
      chunks = []
      yield record


def logged(workdir: pathlib.Path):
  """(run ids, config of the first run, history rows) of every offline run in workdir."""
  ids, config, rows = [], None, []
  for log in sorted(workdir.glob("wandb/offline-run-*/run-*.wandb")):
    for record in read_wandb_log(log):
      kind = record.WhichOneof("record_type")
      if kind == "run":
        ids.append(record.run.run_id)
        if config is None:
          config = {item.key: json.loads(item.value_json)
                    for item in record.run.config.update}
      elif kind == "history":
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
               for item in record.history.item}
        rows.append({key: value for key, value in row.items() if not key.startswith("_")})
  return ids, config, rows


def _has_exit(log: pathlib.Path) -> bool:
  try:
    return any(r.WhichOneof("record_type") == "exit" for r in read_wandb_log(log))
  except DecodeError:  # a record half written
    return False


def wait_for_exits(workdir: pathlib.Path, runs: int, timeout: float = 60.0) -> None:
  """Until `runs` offline run logs end in their exit record. `run.finish()` can return
  before W&B's service process has written the log's last records to disk (seen on a
  loaded 2-core machine: the second run's log read without its records, complete when
  read again after the suite)."""
  deadline = time.monotonic() + timeout
  while True:
    logs = sorted(workdir.glob("wandb/offline-run-*/run-*.wandb"))
    if sum(_has_exit(log) for log in logs) >= runs or time.monotonic() > deadline:
      return
    time.sleep(0.2)


def test_wandb_logs_config_and_rows_and_resumes_the_same_run(tmp_path, monkeypatch):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path))
  monkeypatch.setenv("WANDB_SILENT", "true")
  cfg = metrics.default_config()
  cfg.loggers = ("jsonl", "wandb")
  cfg.wandb.project = "c2jax-test"
  job_config = {"train": {"learning_rate": 0.003, "microbatches": 2}, "task": "pretrain"}
  writer = metrics.MetricsWriter(tmp_path, metrics_cfg=cfg, config=job_config)
  for step in (1, 2, 3):
    writer.write(step, {"loss": 1.0 / step, "note": "text rows stay out of W&B"})
  writer.close()
  run_id = (tmp_path / metrics.RUN_ID_FILE).read_text().strip()
  # Offline runs go to wandb/offline-run-<start second>-<id>: a restart in the same second
  # as the first start (only a test is that quick) would reuse the first one's directory.
  time.sleep(1.1)
  # The job restarts from the checkpoint of step 2: step 3 is logged again, then 4.
  writer = metrics.MetricsWriter(tmp_path, resume_step=2, metrics_cfg=cfg, config=job_config)
  for step in (3, 4):
    writer.write(step, {"loss": 0.9 / step})
  writer.close()

  wait_for_exits(tmp_path, runs=2)
  ids, config, rows = logged(tmp_path)
  assert ids == [run_id, run_id]
  assert config["train"] == job_config["train"] and config["task"] == "pretrain"
  assert [row["step"] for row in rows] == [1, 2, 3, 3, 4]
  assert rows[1]["loss"] == pytest.approx(0.5) and rows[-1]["loss"] == pytest.approx(0.225)
  assert all(set(row) == {"step", "loss"} for row in rows)
  # The JSONL file holds the one curve the checkpoints continue; no TensorBoard asked.
  assert [row["step"] for row in metrics.read_metrics(tmp_path)] == [1, 2, 3, 4]
  assert not (tmp_path / "tensorboard").exists()


def test_loggers_are_validated_by_name():
  cfg = metrics.default_config()
  cfg.loggers = ("jsonl", "mlflow")
  with pytest.raises(configlib.ConfigError, match="metrics.loggers.*mlflow"):
    metrics.validate(cfg)
  cfg.loggers = ("tensorboard", "wandb")
  with pytest.raises(configlib.ConfigError, match="metrics.loggers.*lacks 'jsonl'"):
    metrics.validate(cfg)
  cfg.loggers = ("jsonl", "tensorboard", "wandb")
  metrics.validate(cfg)
