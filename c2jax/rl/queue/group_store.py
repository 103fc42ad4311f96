"""A finished group of rollouts and its on-disk form (one .npz file per group).

Files are written to a temporary name and renamed into place (`atomic_write`), so a
reader never sees a half-written group even if the writer is killed. `locked` is an
exclusive advisory lock (flock) on a file: it serialises both threads (each call opens
its own file description) and processes, including ones started after a crash.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import json
import os
import pathlib
import re
import tempfile

import numpy as np

_ID_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199}")


def check_id(kind: str, value: str) -> str:
  if not isinstance(value, str) or not _ID_RE.fullmatch(value):
    raise ValueError(f"{kind} {value!r} must be 1-200 characters of letters, digits, "
                     "'_', '-', '.', not starting with '.': it names files on disk.")
  return value


@dataclasses.dataclass
class Group:
  """G rollouts (chains) of one prompt, with rewards and advantages, ready to train on.

  group_id: the prompt / task id (single epoch: at most one group per prompt).
  policy_version: the oldest policy version that sampled any of its tokens.
  rewards_G, advantages_G: one value per chain.
  segments: one dict per segment (a chain has >= 1), each mapping a field name to an
    array whose first axis is that segment's length: e.g. tokens, loss_mask,
    sampler_logprobs, versions, router_indices [len, layers, K]. Same keys and dtypes in
    every segment.
  segment_chain_S: the chain (index into rewards_G) each segment belongs to.
  info: JSON-able facts about the rollouts for metrics (pass rate, token counts, ...).
  """
  group_id: str
  policy_version: int
  rewards_G: np.ndarray
  advantages_G: np.ndarray
  segments: list[dict[str, np.ndarray]]
  segment_chain_S: np.ndarray
  info: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    check_id("group_id", self.group_id)
    if len(self.segments) != len(self.segment_chain_S):
      raise ValueError(f"Group {self.group_id}: {len(self.segments)} segments but "
                       f"{len(self.segment_chain_S)} entries in segment_chain_S.")
    if self.segments and any(s.keys() != self.segments[0].keys() for s in self.segments):
      raise ValueError(f"Group {self.group_id}: segments must all have the same fields.")

  def to_bytes(self) -> bytes:
    fields = sorted(self.segments[0]) if self.segments else []
    arrays = {"rewards_G": self.rewards_G, "advantages_G": self.advantages_G,
              "segment_chain_S": self.segment_chain_S,
              "lengths_S": np.array([len(s[fields[0]]) for s in self.segments]
                                    if fields else [], np.int64)}
    for name in fields:
      arrays["seg_" + name] = np.concatenate([np.asarray(s[name]) for s in self.segments])
    meta = {"group_id": self.group_id, "policy_version": int(self.policy_version),
            "fields": fields, "info": self.info}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()

  @classmethod
  def from_bytes(cls, data: bytes) -> Group:
    with np.load(io.BytesIO(data)) as z:
      meta = json.loads(z["meta"].tobytes().decode())
      bounds = np.cumsum(np.concatenate([[0], z["lengths_S"]]))
      columns = {name: z["seg_" + name] for name in meta["fields"]}
      segments = [{name: col[a:b] for name, col in columns.items()}
                  for a, b in zip(bounds[:-1], bounds[1:])]
      return cls(meta["group_id"], meta["policy_version"], z["rewards_G"],
                 z["advantages_G"], segments, z["segment_chain_S"], meta.get("info", {}))


def atomic_write(path: pathlib.Path, data: bytes) -> None:
  """Writes `data` to `path` so readers see the old file or the whole new one."""
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise


@contextlib.contextmanager
def locked(lock_path: pathlib.Path):
  with open(lock_path, "a+b") as f:
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f.fileno(), fcntl.LOCK_UN)
