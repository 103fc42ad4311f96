"""Token capture: one JSONL line per served request, exact enough to train on.

An external agent harness talks text to `c2jax serve`; RL needs what the policy saw and
emitted as token ids (token in, token out), with the sampler's log-probs, the policy
version of every sampled token and the experts every fed token was routed to (router
replay). A line holds:

  id, endpoint, model (as the client sent it: "<name>@<tag>" tags an episode),
  created / first_token / finished (unix seconds),
  seq_id, finish_reason, sampling {temperature, top_k, top_p, max_tokens, seed, ...},
  prompt_ids [P], completion_ids [N], logprobs [N] (float32 values as JSON floats),
  versions   run-length pairs [[version, count], ...] covering the N sampled tokens,
  expert_indices {"dtype", "shape": [P + N, Lm, K], "base64"}: little-endian, the smallest
             unsigned dtype that holds the largest expert index (the engine's
             Generation.expert_indices: row i is token i of prompt_ids + completion_ids).

`read` turns a file back into dicts of numpy arrays. Requests cancelled before they
finish (the client went away) are not captured: they are no trajectory.
"""

from __future__ import annotations

import base64
import json
import os
import threading

import numpy as np

from c2jax.rollout import Generation


def encode_array(array: np.ndarray) -> dict:
  array = np.asarray(array)
  top = int(array.max()) if array.size else 0
  if array.size and int(array.min()) < 0:
    dtype = np.dtype("<i4")
  else:
    dtype = np.dtype("<u1" if top < 2**8 else "<u2" if top < 2**16 else "<u4")
  return {"dtype": dtype.str, "shape": list(array.shape),
          "base64": base64.b64encode(array.astype(dtype).tobytes()).decode("ascii")}


def decode_array(blob: dict) -> np.ndarray:
  raw = base64.b64decode(blob["base64"])
  return np.frombuffer(raw, np.dtype(blob["dtype"])).reshape(blob["shape"]).astype(np.int32)


def run_lengths(values) -> list[list[int]]:
  runs = []
  for value in np.asarray(values).tolist():
    if runs and runs[-1][0] == value:
      runs[-1][1] += 1
    else:
      runs.append([int(value), 1])
  return runs


def expand_runs(runs) -> np.ndarray:
  return np.asarray([v for v, n in runs for _ in range(n)], np.int32)


def record(*, request_id: str, endpoint: str, model: str, generation: Generation,
           timestamps: dict, sampling: dict) -> dict:
  return {
      "id": request_id, "endpoint": endpoint, "model": model, **timestamps,
      "seq_id": int(generation.seq_id), "finish_reason": generation.finish_reason,
      "sampling": sampling,
      "prompt_ids": generation.prompt_tokens.tolist(),
      "completion_ids": generation.tokens.tolist(),
      "logprobs": [float(x) for x in generation.logprobs],
      "versions": run_lengths(generation.versions),
      "expert_indices": encode_array(generation.expert_indices),
  }


class CaptureWriter:
  """Appends lines from any thread; each line is flushed whole, so a killed server
  leaves at most one torn final line (which `read` reports)."""

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(self.path))
    os.makedirs(directory, exist_ok=True)
    self._file = open(self.path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    self._lock = threading.Lock()

  def write(self, line: dict) -> None:
    text = json.dumps(line, separators=(",", ":")) + "\n"
    with self._lock:
      self._file.write(text)
      self._file.flush()

  def close(self) -> None:
    with self._lock:
      self._file.close()


def read(path: str | os.PathLike, start: int = 0, live: bool = False) -> list[dict]:
  """Captured requests with prompt_ids, completion_ids, logprobs, versions (per token)
  and expert_indices as numpy arrays. With `start` (a byte offset, e.g. the file's size
  before a client began), only lines that begin at or after it. `live`: the server is
  still writing, so an unterminated last line is in progress and skipped (otherwise it
  is a torn line, an error)."""
  rows = []
  with open(path, "rb") as f:
    if start > 0:
      f.seek(start - 1)
      if f.read(1) != b"\n":
        f.readline()  # the rest of a line that began before `start`
    for number, raw in enumerate(f, 1):
      if live and not raw.endswith(b"\n"):
        break  # still being written by the live server
      line = raw.decode("utf-8")
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        where = f"line {number}" + (f" after byte {start}" if start else "")
        raise ValueError(f"{path}: {where}: not a JSON line ({e.msg}); a server killed "
                         "mid-write leaves a torn last line, drop it.") from e
      row["prompt_ids"] = np.asarray(row["prompt_ids"], np.int32)
      row["completion_ids"] = np.asarray(row["completion_ids"], np.int32)
      row["logprobs"] = np.asarray(row["logprobs"], np.float32)
      row["versions"] = expand_runs(row["versions"])
      row["expert_indices"] = decode_array(row["expert_indices"])
      rows.append(row)
  return rows
