"""DIR/results.jsonl: one JSON line per (task, sample), appended as episodes end.

Every line is flushed and fsynced before the next episode is booked, so a killed run
loses at most the episodes that were still running. On open, a torn last line (the
process died mid-write) is cut off and its episode runs again; the last record of a
(task, sample) wins. Records with `infra_error` are not "done": a rerun retries them.

DIR/eval_config.json pins what the results measure (suite, policy, samples, agent). A
rerun with a different one is refused: mixing two configs in one file would report a
number that belongs to neither.
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import threading

RESULTS = "results.jsonl"
CONFIG = "eval_config.json"
SUMMARY = "summary.json"


class ResultsStore:
  """Appends records to DIR/results.jsonl; knows which (task, sample) pairs are done."""

  def __init__(self, workdir: str | os.PathLike):
    self.dir = pathlib.Path(workdir)
    self.dir.mkdir(parents=True, exist_ok=True)
    # One writer per run dir: two appending runs would interleave and redo each other.
    self._lock_file = open(self.dir / ".results.lock", "w")
    try:
      fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      self._lock_file.close()
      raise RuntimeError(f"another process is writing {self.dir / RESULTS}; wait for it "
                         "or use another --workdir.") from None
    self.path = self.dir / RESULTS
    self._lock = threading.Lock()
    self._records: dict[tuple[str, int], dict] = {}
    self.torn_lines = 0
    self._load()
    self._file = open(self.path, "a", encoding="utf-8")

  def _load(self) -> None:
    if not self.path.exists():
      return
    data = self.path.read_bytes()
    good_end = 0
    for line_end in _line_ends(data):
      line = data[good_end:line_end]
      try:
        record = json.loads(line)
        key = (record["task_id"], int(record["sample"]))
      except (ValueError, KeyError, TypeError):
        break  # torn or foreign: everything from here on is redone
      self._records[key] = record
      good_end = line_end + 1
    if good_end < len(data):
      self.torn_lines = data[good_end:].count(b"\n") + (not data.endswith(b"\n"))
      with open(self.path, "r+b") as f:
        f.truncate(good_end)
        f.flush()
        os.fsync(f.fileno())

  def done(self) -> set[tuple[str, int]]:
    """(task, sample) pairs with a model result (infra errors are retried)."""
    return {key for key, r in self._records.items() if not r.get("infra_error")}

  def records(self) -> list[dict]:
    return list(self._records.values())

  def append(self, record: dict) -> None:
    line = json.dumps(record, sort_keys=True, default=_jsonable) + "\n"
    with self._lock:
      self._file.write(line)
      self._file.flush()
      os.fsync(self._file.fileno())
      self._records[(record["task_id"], int(record["sample"]))] = record

  def close(self) -> None:
    self._file.close()
    self._lock_file.close()  # releases the lock

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def _line_ends(data: bytes):
  start = 0
  while (end := data.find(b"\n", start)) >= 0:
    yield end
    start = end + 1


def _jsonable(value):
  if hasattr(value, "item"):
    return value.item()
  if hasattr(value, "tolist"):
    return value.tolist()
  raise TypeError(f"result field of type {type(value).__name__} is not JSON-serialisable")


def load_records(workdir: str | os.PathLike) -> list[dict]:
  """The records of a run dir, last per (task, sample), torn tail ignored (read-only)."""
  path = pathlib.Path(workdir) / RESULTS
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist; is {workdir} an eval run directory "
                            "(written by `c2jax eval --workdir=...`)?")
  records = {}
  for line in path.read_text(encoding="utf-8").splitlines():
    try:
      record = json.loads(line)
      records[(record["task_id"], int(record["sample"]))] = record
    except (ValueError, KeyError, TypeError):
      break
  return list(records.values())


def pin_config(workdir: str | os.PathLike, pinned: dict) -> None:
  """Writes DIR/eval_config.json, or checks that a resumed run measures the same thing."""
  path = pathlib.Path(workdir) / CONFIG
  if path.exists():
    previous = json.loads(path.read_text())
    if previous != pinned:
      changed = sorted(k for k in set(previous) | set(pinned)
                       if previous.get(k) != pinned.get(k))
      raise ValueError(f"{workdir} holds results of a different evaluation (changed: "
                       f"{changed}); use a new --workdir, or restore the earlier config "
                       f"({path}).")
    return
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(pinned, indent=2, sort_keys=True))
  tmp.rename(path)


def write_summary(workdir: str | os.PathLike, summary: dict) -> pathlib.Path:
  path = pathlib.Path(workdir) / SUMMARY
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(summary, indent=2, sort_keys=True))
  tmp.rename(path)
  return path
