"""The bounded, staleness-aware, persisted queue between rollout actors and the learner.

Everything lives in one directory, so actor processes, the learner and a restarted
learner all see the same state; a file lock serialises changes. Each finished group is
one file that moves between folders by atomic rename:

  ready/<seq>.<version>.<id>.npz   waiting; `seq` keeps FIFO order, `version` is the
                                   group's policy version (read without opening it)
  claimed/...   handed to the learner, not yet trained
  trained/...   trained on at a step whose manifest is written
  stale/...     dropped: its policy version lagged the learner by more than max_lag
  ahead/...     refused: its policy version is ahead of the learner, so it was sampled
                by weights of a discarded future (published by a learner incarnation
                after the checkpoint this one resumed from); kept for inspection only.
                Such a group no longer counts as queued (`contains` is False), so its
                prompt goes back to the pool and is rolled out again by a live policy
  steps/<step>.json                manifest: the group ids trained at that step
  discarded/<step>.<ns>.json       the manifest of a step a resumed learner discarded
  record.jsonl                     append-only: one row per trained step, and one per
                                   step discarded on resume (`history` reads it)

Exactly-once training across crashes: the learner calls `mark_trained(ids, step)` after
each step and `recover(checkpoint_step)` when it starts. Groups trained at steps after
the checkpoint it resumes from did not survive into its parameters, so they go back to
ready (in their original order); groups claimed but never trained go back too; groups in
manifests up to the checkpoint stay trained and are never handed out again; groups whose
version is ahead of the checkpoint are refused (ahead/), as `get` refuses any group ahead
of the learner. What a discarded step trained is never erased: its manifest moves to
discarded/ and record.jsonl says which steps were discarded by which resume.
Back-pressure: `put` blocks (or raises queue.Full after `timeout`) while `capacity`
groups are waiting, so actors never run more than a queue's worth ahead.
"""

from __future__ import annotations

import json
import os
import pathlib
import queue
import time

from c2jax.rl.queue.group_store import Group, atomic_write, check_id, locked

_STATES = ("ready", "claimed", "trained", "stale")  # a group in one of these was queued
_REFUSED = "ahead"
RECORD = "record.jsonl"


def _group_id(name: str) -> str:
  return name.split(".", 2)[2][:-len(".npz")]


def _version(name: str) -> int:
  return int(name.split(".", 2)[1])


class GroupQueue:
  """See the module docstring. Safe to share across threads and processes."""

  def __init__(self, root, capacity: int, max_lag: int, poll_s: float = 0.02):
    if capacity < 1 or max_lag < 0:
      raise ValueError(f"GroupQueue needs capacity >= 1 and max_lag >= 0 (got {capacity}, "
                       f"{max_lag}); see config.rl.queue.")
    self.root = pathlib.Path(root)
    self.capacity, self.max_lag, self.poll_s = capacity, max_lag, poll_s
    for name in _STATES + (_REFUSED, "steps", "tmp"):
      (self.root / name).mkdir(parents=True, exist_ok=True)
    self._lock = self.root / "lock"

  def _names(self, state: str) -> list[str]:
    return sorted(n for n in os.listdir(self.root / state) if n.endswith(".npz"))

  def _move(self, name: str, src: str, dst: str) -> None:
    os.replace(self.root / src / name, self.root / dst / name)

  def _find(self, group_id: str) -> tuple[str, str] | None:
    for state in _STATES:
      for name in self._names(state):
        if _group_id(name) == group_id:
          return state, name
    return None

  def contains(self, group_id: str) -> bool:
    """Whether the group was ever put (waiting, training, trained or dropped)."""
    with locked(self._lock):
      return self._find(group_id) is not None

  def counts(self) -> dict[str, int]:
    with locked(self._lock):
      return {state: len(self._names(state)) for state in _STATES + (_REFUSED,)}

  def put(self, group: Group, timeout: float | None = None) -> None:
    """Adds a finished group; blocks while the queue is full (queue.Full after timeout).

    Raises ValueError if a group with this id was put before: a prompt is rolled out
    and trained at most once.
    """
    check_id("group_id", group.group_id)
    tmp = self.root / "tmp" / f"{os.getpid()}-{id(group)}-{time.monotonic_ns()}.npz"
    atomic_write(tmp, group.to_bytes())  # the slow part, outside the lock
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
      while True:
        with locked(self._lock):
          if self._find(group.group_id) is not None:
            raise ValueError(f"Group {group.group_id!r} was already queued: each prompt is "
                             "trained once (single epoch); give repeats a new id.")
          if len(self._names("ready")) < self.capacity:
            seq = self._next_seq()
            name = f"{seq:020d}.{int(group.policy_version)}.{group.group_id}.npz"
            os.replace(tmp, self.root / "ready" / name)
            return
        if deadline is not None and time.monotonic() >= deadline:
          raise queue.Full(f"GroupQueue {self.root} holds {self.capacity} groups waiting "
                           "for the learner; raise config.rl.queue.capacity or wait.")
        time.sleep(self.poll_s)
    finally:
      if tmp.exists():
        tmp.unlink()

  def _next_seq(self) -> int:
    path = self.root / "next_seq"
    seq = int(path.read_text()) if path.exists() else 0
    atomic_write(path, str(seq + 1).encode())
    return seq

  def get(self, learner_version: int, timeout: float | None = None) -> Group:
    """The oldest group within max_lag of `learner_version` (queue.Empty after timeout).

    Groups lagging further are moved to stale/ and never returned; groups ahead of
    `learner_version` (sampled by weights this learner never had) are refused (ahead/).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      with locked(self._lock):
        for name in self._names("ready"):
          version = _version(name)
          if version > learner_version:
            self._move(name, "ready", _REFUSED)
            continue
          if learner_version - version > self.max_lag:
            self._move(name, "ready", "stale")
            continue
          self._move(name, "ready", "claimed")
          return Group.from_bytes((self.root / "claimed" / name).read_bytes())
      if deadline is not None and time.monotonic() >= deadline:
        raise queue.Empty(f"No group within max_lag={self.max_lag} of version "
                          f"{learner_version} arrived in {timeout}s in {self.root}.")
      time.sleep(self.poll_s)

  def mark_trained(self, group_ids, step: int) -> None:
    """Records (atomically) that `group_ids` were trained at `step`; call after the step."""
    with locked(self._lock):
      claimed = {_group_id(n): n for n in self._names("claimed")}
      missing = sorted(set(group_ids) - set(claimed))
      if missing:
        raise ValueError(f"mark_trained: groups {missing} were not handed out by get(); "
                         "only claimed groups can be marked trained.")
      atomic_write(self.root / "steps" / f"{step:012d}.json",
                   json.dumps(sorted(group_ids)).encode())
      self._append_record({"event": "trained", "step": int(step),
                           "groups": sorted(group_ids)})
      for group_id in group_ids:
        self._move(claimed[group_id], "claimed", "trained")

  def _append_record(self, row: dict) -> None:
    """One line of record.jsonl (under the lock; never rewritten)."""
    with open(self.root / RECORD, "a", encoding="utf-8") as record:
      record.write(json.dumps({**row, "time": round(time.time(), 3)}) + "\n")
      record.flush()
      os.fsync(record.fileno())

  def history(self) -> list[dict]:
    """Every step ever trained, in order: {step, groups, time, discarded}; `discarded` is
    the checkpoint step of the resume that dropped it, or None if it stands."""
    with locked(self._lock):
      path = self.root / RECORD
      lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    trained: list[dict] = []
    for line in lines:
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        continue  # a line cut short by a kill
      if row["event"] == "trained":
        trained.append({**{k: row[k] for k in ("step", "groups", "time")},
                        "discarded": None})
      elif row["event"] == "discarded":
        for entry in reversed(trained):
          if entry["step"] == row["step"] and entry["discarded"] is None:
            entry["discarded"] = row["resumed_from"]
            break
    return trained

  def _manifests(self) -> dict[int, list[str]]:
    return {int(p.stem): json.loads(p.read_text())
            for p in (self.root / "steps").glob("*.json")}

  def trained_steps(self) -> dict[int, list[str]]:
    """{step: group ids} of every recorded step."""
    with locked(self._lock):
      return self._manifests()

  def recover(self, checkpoint_step: int) -> int:
    """Makes the queue match a learner resuming from `checkpoint_step`; returns how many
    groups went back to ready. Use -1 (or any step below the first) for a fresh learner.

    Afterwards no group trained at a step <= checkpoint_step can be handed out again,
    and no group sampled by a policy version > checkpoint_step (a discarded future) can
    be handed out at all: those are refused (see `refused_ids`)."""
    with locked(self._lock):
      kept: set[str] = set()
      for step, ids in sorted(self._manifests().items()):
        if step > checkpoint_step:
          self._append_record({"event": "discarded", "step": step, "groups": ids,
                               "resumed_from": int(checkpoint_step)})
          (self.root / "discarded").mkdir(exist_ok=True)
          os.replace(self.root / "steps" / f"{step:012d}.json",
                     self.root / "discarded" / f"{step:012d}.{time.time_ns()}.json")
        else:
          kept.update(ids)
      requeued = 0
      for state in ("claimed", "trained"):
        for name in self._names(state):
          if _group_id(name) in kept:
            if state == "claimed":  # killed between manifest and move
              self._move(name, "claimed", "trained")
          elif _version(name) > checkpoint_step:
            self._move(name, state, _REFUSED)
          else:
            self._move(name, state, "ready")
            requeued += 1
      for name in self._names("ready"):
        if _version(name) > checkpoint_step:
          self._move(name, "ready", _REFUSED)
      return requeued

  def refused_ids(self) -> list[str]:
    """Ids of groups refused as ahead of the learner (their prompts may be rolled out
    again: they no longer count as queued)."""
    with locked(self._lock):
      return [_group_id(n) for n in self._names(_REFUSED)]
