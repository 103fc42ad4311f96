"""A run's training data as a fixed number of streams, so that the global batch does not
depend on how many processes read it.

The data of a run is `count` streams, fixed when the run starts (config.train.data_streams,
or the process count of its first start). Stream s is its own grain pipeline over every
count-th example from s (shuffled, tokenized, packed and batched on its own, global batch
/ count rows per batch). The global batch of step t is every stream's t-th
batch, concatenated in stream order. A process reads the streams whose rows its devices
hold (`held_streams`), so on any process count that divides `count` every step sees the
same global batch: a run resumed on another number of processes neither skips nor
repeats an example, and its losses are those of the run it continues.

One stream per process (the default) is exactly what each process read before streams
existed: stream s is the shard of process s.

State: `StreamIterator.get_state()` is {"count": S, "streams": {"s": grain state}} for the
streams this process reads; a multi-process checkpoint keeps every process's dict, and
`merge` makes the run's whole state of them (checkpoints of one stream per process
written before streams existed read as the same thing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


class StreamSet:
  """The streams `held` of `count`, read as one dataset: `make(s)` builds stream s (an
  iterable whose iterator has get_state / set_state, e.g. a grain IterDataset)."""

  def __init__(self, make: Callable[[int], object], count: int, held: Sequence[int]):
    held = list(held)
    if count < 1 or not held or any(not 0 <= s < count for s in held):
      raise ValueError(f"streams {held} of {count}: need at least one stream, each in "
                       f"[0, {count}).")
    self.count = count
    self._streams = {s: make(s) for s in held}

  def __iter__(self) -> "StreamIterator":
    return StreamIterator(self.count, {s: iter(ds) for s, ds in self._streams.items()})


class StreamIterator:
  """Next: one batch of every held stream, rows concatenated in stream order."""

  def __init__(self, count: int, iterators: dict[int, object]):
    self.count = count
    self._iterators = dict(sorted(iterators.items()))

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batches = [next(it) for it in self._iterators.values()]
    if len(batches) == 1:
      return batches[0]
    return {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}

  def get_state(self) -> dict:
    return {"count": self.count,
            "streams": {str(s): it.get_state() for s, it in self._iterators.items()}}

  def set_state(self, state: dict) -> None:
    """Continues from `state`: the run's whole state (`merge`), or this iterator's own."""
    if state.get("count") != self.count:
      raise ValueError(f"the saved data state is of {state.get('count')} streams; this "
                       f"iterator reads {self.count}.")
    missing = [s for s in self._iterators if str(s) not in state["streams"]]
    if missing:
      raise ValueError(f"the saved data state has no state for streams {missing}.")
    for s, it in self._iterators.items():
      it.set_state(state["streams"][str(s)])


def merge(per_process: Sequence[dict]) -> dict | None:
  """The run's whole data state from what each process of the writing run saved (in
  process order): {"count": S, "streams": {"s": state}}, every stream once; None when the
  run saved no data state. Processes that read the same streams (a mesh axis that
  replicates the batch) saved the same states; one is kept."""
  per_process = [p for p in per_process if p]
  if not per_process:
    return None
  if all("streams" not in p for p in per_process):
    # Written before streams: one grain state per process, the shard of that process.
    return {"count": len(per_process),
            "streams": {str(i): state for i, state in enumerate(per_process)}}
  counts = {p.get("count") for p in per_process}
  if len(counts) != 1 or any("streams" not in p for p in per_process):
    raise ValueError(f"the processes saved data states of different stream counts {counts}.")
  merged = {}
  for p in per_process:
    merged.update(p["streams"])
  count = counts.pop()
  if sorted(merged, key=int) != [str(s) for s in range(count)]:
    raise ValueError(f"the saved data state covers streams {sorted(merged, key=int)} of "
                     f"{count}.")
  return {"count": count, "streams": merged}


def held_streams(rows: Sequence[tuple[int, int]], global_batch: int, count: int) -> list[int]:
  """The streams whose rows are the batch rows `rows` ([start, stop) ranges, this
  process's devices' slices of the global batch); ValueError when a range splits a
  stream's rows."""
  if global_batch % count:
    raise ValueError(f"the global batch of {global_batch} rows is not divisible into "
                     f"{count} streams.")
  per_stream = global_batch // count
  held = set()
  for start, stop in rows:
    if start % per_stream or stop % per_stream:
      raise ValueError(f"this process holds batch rows [{start}, {stop}), which split the "
                       f"{per_stream} rows of a stream ({count} streams of a batch of "
                       f"{global_batch}).")
    held.update(range(start // per_stream, stop // per_stream))
  return sorted(held)
