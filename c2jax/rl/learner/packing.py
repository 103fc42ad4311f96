"""Packing a step's sequences into a batch that balances compute across data-parallel ranks.

Each rank gets the same number of rows (the jitted step has a fixed [B, L] per rank), and
the rows are assigned so the ranks' estimated compute is as even as possible. The cost of
a sequence of length n is n + attention_cost * n^2: the MLP and projections grow linearly
with n, causal attention quadratically, so one long sequence can outweigh many short ones
(attention_cost ~ 1 / (the length where attention matches the rest of the layer)).
Greedy longest-processing-time: the costliest sequence goes to the cheapest rank that
still has a free row.
"""

from __future__ import annotations

import numpy as np


def sequence_cost(lengths, attention_cost: float) -> np.ndarray:
  lengths = np.asarray(lengths, np.float64)
  return lengths + attention_cost * lengths * lengths


def balance_across_ranks(lengths, num_ranks: int, attention_cost: float) -> list[list[int]]:
  """Sequence indices per rank; each rank gets ceil(n / num_ranks) rows at most."""
  if num_ranks < 1:
    raise ValueError(f"num_ranks must be >= 1 (got {num_ranks}).")
  costs = sequence_cost(lengths, attention_cost)
  rows = -(-len(costs) // num_ranks)
  load, assigned = np.zeros(num_ranks), [[] for _ in range(num_ranks)]
  for index in np.argsort(-costs, kind="stable"):
    open_ranks = [r for r in range(num_ranks) if len(assigned[r]) < rows]
    rank = min(open_ranks, key=lambda r: (load[r], r))
    assigned[rank].append(int(index))
    load[rank] += costs[index]
  return assigned


def pack_batch(segments: list[dict[str, np.ndarray]], advantages_S, num_ranks: int,
               seq_len: int, attention_cost: float,
               rows_per_rank: int | None = None) -> tuple[dict[str, np.ndarray], dict]:
  """(batch, metrics): every field as [num_ranks * rows, seq_len, ...], rank-major (rank r
  owns rows r*rows .. (r+1)*rows - 1, so sharding the batch axis over ranks keeps the
  balance), padded with zeros; `advantages` [B]; `row_sequence` [B] (-1 for padding).
  rows_per_rank fixes `rows` (>= what the segments need), e.g. for one compiled shape."""
  if not segments:
    raise ValueError("pack_batch needs at least one segment.")
  first = next(iter(segments[0]))
  lengths = [len(s[first]) for s in segments]
  too_long = [i for i, n in enumerate(lengths) if n > seq_len]
  if too_long:
    raise ValueError(f"Segments {too_long} are longer than seq_len = {seq_len} (longest "
                     f"{max(lengths)}); raise the learner's sequence length.")
  assigned = balance_across_ranks(lengths, num_ranks, attention_cost)
  rows = -(-len(segments) // num_ranks)
  if rows_per_rank is not None:
    if rows_per_rank < rows:
      raise ValueError(f"rows_per_rank = {rows_per_rank} cannot hold {len(segments)} "
                       f"segments on {num_ranks} ranks (needs {rows}).")
    rows = rows_per_rank
  order = [i for rank in assigned for i in rank + [-1] * (rows - len(rank))]
  batch = {}
  for name, example in segments[0].items():
    example = np.asarray(example)
    out = np.zeros((len(order), seq_len) + example.shape[1:], example.dtype)
    for row, index in enumerate(order):
      if index >= 0:
        out[row, :lengths[index]] = segments[index][name]
    batch[name] = out
  advantages_S = np.asarray(advantages_S, np.float32)
  batch["advantages"] = np.array([advantages_S[i] if i >= 0 else 0.0 for i in order],
                                 np.float32)
  batch["row_sequence"] = np.asarray(order, np.int32)
  costs = sequence_cost(lengths, attention_cost)
  loads = np.array([costs[rank].sum() if rank else 0.0 for rank in assigned])
  return batch, {"rank_imbalance": float(loads.max() / max(loads.mean(), 1e-9))}
