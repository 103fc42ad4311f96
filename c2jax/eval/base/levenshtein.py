"""Character edit distance and the state-tracking score built on it.

`distance` is the Levenshtein distance (unit-cost insertions, deletions, substitutions of
characters), computed with Myers' bit-parallel algorithm in Hyyrö's formulation: one
column of the DP table is two bit vectors held in Python integers, so a pair of 20 KB
files costs ~20 K iterations of a few big-integer operations instead of 4e8 cell updates.

`similarity(a, b) = 1 - distance(a, b) / max(len(a), len(b))` (1.0 for two empty
strings): the normalised character similarity LoCoDiff-style state tracking reports; 1.0
means identical, 0.0 means nothing in common at the character level.
"""

from __future__ import annotations


def distance(a: str, b: str) -> int:
  """Levenshtein distance between two strings, in characters."""
  if len(a) < len(b):
    a, b = b, a  # the shorter one is the bit-vector pattern
  m = len(b)
  if m == 0:
    return len(a)
  peq: dict[str, int] = {}
  for i, char in enumerate(b):
    peq[char] = peq.get(char, 0) | (1 << i)
  mask = (1 << m) - 1
  high = 1 << (m - 1)
  pv, mv, score = mask, 0, m
  for char in a:
    eq = peq.get(char, 0)
    xv = eq | mv
    xh = (((eq & pv) + pv) ^ pv) | eq
    ph = mv | (~(xh | pv) & mask)
    mh = pv & xh
    if ph & high:
      score += 1
    elif mh & high:
      score -= 1
    # Shifting a 1 into ph: row 0 of the table grows by one per text character.
    ph = ((ph << 1) | 1) & mask
    mh = (mh << 1) & mask
    pv = mh | (~(xv | ph) & mask)
    mv = ph & xv
  return score


def similarity(a: str, b: str) -> float:
  """1 - distance / max length, in [0, 1]; see the module docstring."""
  longest = max(len(a), len(b))
  return 1.0 if longest == 0 else 1.0 - distance(a, b) / longest
