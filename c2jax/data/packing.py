"""Packing variable-length documents into fixed-length rows with segment ids and positions.

A document of T token ids becomes one next-token example of length T-1 (inputs = ids[:-1],
targets = ids[1:], loss_mask aligned with targets). Packers place several examples in a
row of length L and emit the train-step row format (c2jax/train/step.py):

  inputs, targets, positions, segment_ids  int32 [L]
  loss_mask                                float32 [L]

segment_ids number the pieces of a row 1..n (0 = padding), positions restart at 0 for
each piece, so the model's attention never crosses a document boundary and padding is
never trained on.

Packers (by name):
  concat_then_split  no padding: documents run on across rows and are split at row ends
                     (a continued piece restarts its positions). For pretraining.
  first_fit          documents are never split: each is truncated to L and placed in the
                     first of a few open rows with room, the rest is padding. For chat/SFT,
                     where a conversation should be seen whole.
"""

from __future__ import annotations

from collections.abc import Callable

import grain
import numpy as np
from grain import experimental as grain_experimental

FEATURES = ("inputs", "targets", "loss_mask")
# A packed row: its arrays and their dtypes (what the train and eval steps take).
ROW_DTYPES = {"inputs": np.int32, "targets": np.int32, "loss_mask": np.float32,
              "positions": np.int32, "segment_ids": np.int32}
# Open rows first_fit fills at once: more rows, less padding, more out-of-order emission.
_FIRST_FIT_ROWS = 8


def example(ids: np.ndarray, loss_mask: np.ndarray) -> dict[str, np.ndarray]:
  """The next-token example of one document; loss_mask[t] is the mask of ids[t + 1]."""
  if len(ids) != len(loss_mask):
    raise ValueError(f"ids ({len(ids)}) and loss_mask ({len(loss_mask)}) differ in length.")
  return {"inputs": np.asarray(ids[:-1], np.int32), "targets": np.asarray(ids[1:], np.int32),
          "loss_mask": np.asarray(loss_mask[1:], np.float32)}


def _to_row(packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  source = {"positions": "inputs_positions", "segment_ids": "inputs_segment_ids"}
  return {key: packed[source.get(key, key)].astype(dtype, copy=False)
          for key, dtype in ROW_DTYPES.items()}


def empty_rows(rows: int, length: int) -> dict[str, np.ndarray]:
  """A batch of `rows` padding rows, shaped and typed as packed ones, with no loss token
  (what a process whose data has run out feeds a collective step the others still run)."""
  return {key: np.zeros((rows, length), dtype) for key, dtype in ROW_DTYPES.items()}


class _Truncate:
  def __init__(self, length: int):
    self.length = length

  def __call__(self, element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v[:self.length] for k, v in element.items()}


def _concat_then_split(ds: grain.IterDataset, length: int, seed: int) -> grain.IterDataset:
  del seed  # deterministic: rows follow the document order
  return grain_experimental.ConcatThenSplitIterDataset(
      ds, length_struct={f: length for f in FEATURES})


def _first_fit(ds: grain.IterDataset, length: int, seed: int) -> grain.IterDataset:
  return grain_experimental.FirstFitPackIterDataset(
      ds.map(_Truncate(length)), length_struct={f: length for f in FEATURES},
      num_packing_bins=_FIRST_FIT_ROWS, seed=seed, shuffle_bins=False)


PACKERS: dict[str, Callable[[grain.IterDataset, int, int], grain.IterDataset]] = {
    "concat_then_split": _concat_then_split,
    "first_fit": _first_fit,
}


def pack(ds: grain.IterDataset, packer: str, length: int, seed: int = 0) -> grain.IterDataset:
  """Packs an IterDataset of `example`s into rows of `length` (see the module docstring)."""
  if packer not in PACKERS:
    raise ValueError(f"unknown packer {packer!r}; expected one of {sorted(PACKERS)}.")
  if length <= 0:
    raise ValueError(f"sequence length is {length}; it must be > 0.")
  return PACKERS[packer](ds, length, seed).map(_to_row)
