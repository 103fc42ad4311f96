"""Packers: segment ids, positions, padding and next-token alignment."""

import collections

import grain
import numpy as np
import pytest

from c2jax.data import packing

LENGTHS = [5, 12, 3, 9, 2, 7]


def _examples():
  docs = [np.arange(len_, dtype=np.int32) + 100 * (i + 1) for i, len_ in enumerate(LENGTHS)]
  return [packing.example(d, np.ones_like(d)) for d in docs]


def _rows(packer, length=8):
  ds = grain.MapDataset.source(_examples()).to_iter_dataset()
  return list(packing.pack(ds, packer, length))


def check_row(row):
  """Invariants every packed row satisfies (shared with the pipeline tests)."""
  seg, pos = row["segment_ids"], row["positions"]
  assert seg.dtype == pos.dtype == row["inputs"].dtype == row["targets"].dtype == np.int32
  assert row["loss_mask"].dtype == np.float32
  real = seg > 0
  n = int(real.sum())
  assert real[:n].all() and not real[n:].any(), "padding only at the end"
  assert (row["loss_mask"][~real] == 0).all() and (row["inputs"][~real] == 0).all()
  if n:
    assert seg[0] == 1 and set(np.diff(seg[:n])) <= {0, 1}
    starts = np.flatnonzero(np.diff(seg[:n], prepend=0))
    for a, b in zip(starts, list(starts[1:]) + [n]):
      np.testing.assert_array_equal(pos[a:b], np.arange(b - a))
      # Inside one piece, the target at t is the input at t + 1.
      np.testing.assert_array_equal(row["targets"][a:b - 1], row["inputs"][a + 1:b])


@pytest.mark.parametrize("packer", sorted(packing.PACKERS))
def test_rows_hold_every_token_once(packer):
  rows = _rows(packer)
  for row in rows:
    assert row["inputs"].shape == (8,)
    check_row(row)
  got = collections.Counter(int(t) for r in rows for t in r["targets"][r["segment_ids"] > 0])
  # first_fit truncates each document to the row length; concat_then_split splits instead.
  keep = 8 if packer == "first_fit" else None
  want = collections.Counter(int(t) for e in _examples() for t in e["targets"][:keep])
  assert got == want
  if packer == "concat_then_split":
    assert all((r["segment_ids"] > 0).all() for r in rows[:-1]), "no padding but at the end"


def test_first_fit_never_splits_a_document():
  rows = _rows("first_fit")
  pieces = []
  for r in rows:
    for s in range(1, r["segment_ids"].max() + 1):
      pieces.append(r["inputs"][r["segment_ids"] == s].tolist())
  # Each example appears whole (the 11-token one truncated to the row length).
  want = sorted(e["inputs"][:8].tolist() for e in _examples())
  assert sorted(pieces) == want


def test_unknown_packer_is_an_error():
  ds = grain.MapDataset.source(_examples()).to_iter_dataset()
  with pytest.raises(ValueError, match="unknown packer 'best'"):
    packing.pack(ds, "best", 8)
