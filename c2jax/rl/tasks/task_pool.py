"""Prompts waiting for rollouts, leased to actors, re-queued when an actor dies.

One directory shared by the supervisor and its actor processes:
  pending/<seq>.<task_id>.json         not yet leased (FIFO by seq)
  leased/<actor_id>/<seq>.<task_id>.json
  done/<task_id>                       its group reached the GroupQueue (the payload,
                                       kept so the task can be reopened)
  released/<task_id>                   how often `release` returned it
  open                                 present while the learner will add more tasks
                                       (a running curriculum draws them as it trains)
A crashed actor loses only its in-flight rollouts: `requeue(actor_id, finished=...)`
returns its leases to pending, except tasks whose group was already queued (the actor
died after `put` but before `complete`), which are marked done so they never run twice.
`release(actor_id, task_id)` returns one lease (its rollouts failed for infrastructure
reasons); `reopen(task_ids, finished=...)` returns done tasks whose group the queue
refused (sampled by a discarded policy), so they are rolled out again. Both go to the
front of the pending order.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable, Iterable

from c2jax.rl.queue.group_store import atomic_write, check_id, locked


_REORDER = ".reorder."
_FRONT = "000000000000"  # a seq that sorts before every added task: returned tasks first


def _task_id(name: str) -> str:
  return name.split(".", 1)[1][:-len(".json")]


class TaskPool:
  """See the module docstring. Safe to share across threads and processes."""

  def __init__(self, root):
    self.root = pathlib.Path(root)
    for name in ("pending", "leased", "done", "released"):
      (self.root / name).mkdir(parents=True, exist_ok=True)
    self._lock = self.root / "lock"

  def _pending(self) -> list[str]:
    folder = self.root / "pending"
    for name in os.listdir(folder):  # finish a reorder that was killed midway
      if name.startswith(_REORDER):
        os.replace(folder / name, folder / name[len(_REORDER):])
    return sorted(os.listdir(folder))

  def _leases(self, actor_id: str | None = None) -> list[tuple[str, str]]:
    actors = [actor_id] if actor_id else sorted(os.listdir(self.root / "leased"))
    return [(a, n) for a in actors if (self.root / "leased" / a).is_dir()
            for n in sorted(os.listdir(self.root / "leased" / a))]

  def _known(self) -> set[str]:
    names = self._pending() + [n for _, n in self._leases()]
    return {_task_id(n) for n in names} | set(os.listdir(self.root / "done"))

  def add(self, tasks: Iterable[tuple[str, dict]]) -> int:
    """Adds (task_id, JSON-able payload) pairs; ids seen before are skipped. Returns the
    number added."""
    with locked(self._lock):
      known, added = self._known(), 0
      seq = len(known)  # every task ever added is pending, leased or done
      for task_id, payload in tasks:
        if check_id("task_id", task_id) in known:
          continue
        atomic_write(self.root / "pending" / f"{seq:012d}.{task_id}.json",
                     json.dumps(payload).encode())
        known.add(task_id)
        seq, added = seq + 1, added + 1
      return added

  def pending_tasks(self) -> list[tuple[str, dict]]:
    """(task_id, payload) of every pending task, in lease order."""
    with locked(self._lock):
      return [(_task_id(n), json.loads((self.root / "pending" / n).read_text()))
              for n in self._pending()]

  def reorder(self, task_ids: list[str]) -> None:
    """Makes the pending tasks lease in the order `task_ids` (which must list each
    pending task exactly once), e.g. a curriculum's order."""
    with locked(self._lock):
      names = {_task_id(n): n for n in self._pending()}
      if sorted(task_ids) != sorted(names):
        missing, extra = sorted(set(names) - set(task_ids)), sorted(set(task_ids) - set(names))
        raise ValueError(f"reorder must list every pending task once; missing {missing[:5]}, "
                         f"not pending {extra[:5]}.")
      first = min((int(n.split(".", 1)[0]) for n in names.values()), default=0)
      folder = self.root / "pending"
      # Two passes, as new names may equal old ones; a temporary name carries its final
      # name, so `_pending` completes a reorder that was killed midway.
      for i, task_id in enumerate(task_ids):
        os.replace(folder / names[task_id], folder / f"{_REORDER}{first + i:012d}.{task_id}.json")
      for name in os.listdir(folder):
        if name.startswith(_REORDER):
          os.replace(folder / name, folder / name[len(_REORDER):])

  def lease(self, actor_id: str) -> tuple[str, dict] | None:
    """The oldest pending task, now leased to `actor_id`; None when none is pending."""
    check_id("actor_id", actor_id)
    with locked(self._lock):
      pending = self._pending()
      if not pending:
        return None
      (self.root / "leased" / actor_id).mkdir(exist_ok=True)
      target = self.root / "leased" / actor_id / pending[0]
      os.replace(self.root / "pending" / pending[0], target)
      return _task_id(pending[0]), json.loads(target.read_text())

  def _take_lease(self, actor_id: str, task_id: str, target) -> None:
    for _, name in self._leases(actor_id):
      if _task_id(name) == task_id:
        os.replace(self.root / "leased" / actor_id / name, target(name))
        return
    raise KeyError(f"Actor {actor_id!r} holds no lease on task {task_id!r}.")

  def complete(self, actor_id: str, task_id: str) -> None:
    with locked(self._lock):
      self._take_lease(actor_id, task_id, lambda name: self.root / "done" / task_id)

  def release(self, actor_id: str, task_id: str, max_releases: int | None = None) -> bool:
    """Returns a leased task to the front of pending (its rollouts could not be run) and
    True; after `max_releases` earlier releases of the task it is marked done instead
    (dropped for good: its environment keeps failing) and False."""
    with locked(self._lock):
      counter = self.root / "released" / check_id("task_id", task_id)
      count = int(counter.read_text()) if counter.exists() else 0
      if max_releases is not None and count >= max_releases:
        self._take_lease(actor_id, task_id, lambda name: self.root / "done" / task_id)
        return False
      self._take_lease(actor_id, task_id,
                       lambda name: self.root / "pending" / f"{_FRONT}.{task_id}.json")
      atomic_write(counter, str(count + 1).encode())
      return True

  def reopen(self, task_ids: Iterable[str],
             finished: Callable[[str], bool] = lambda task_id: False) -> int:
    """Moves done tasks back to the front of pending, except those `finished` (e.g.
    GroupQueue.contains: a later group of the task is queued); returns how many."""
    with locked(self._lock):
      reopened = 0
      for task_id in task_ids:
        done = self.root / "done" / check_id("task_id", task_id)
        if not done.exists() or finished(task_id):
          continue
        if done.stat().st_size == 0:
          raise ValueError(f"Task {task_id!r} in {self.root} is done but its payload was "
                           "not kept (a pool written by an older c2jax); add it again.")
        os.replace(done, self.root / "pending" / f"{_FRONT}.{task_id}.json")
        reopened += 1
      return reopened

  def requeue(self, actor_id: str | None = None,
              finished: Callable[[str], bool] = lambda task_id: False) -> int:
    """Returns the leases of `actor_id` (all actors when None) to pending, except tasks
    for which `finished(task_id)` (e.g. GroupQueue.contains); returns how many."""
    with locked(self._lock):
      requeued = 0
      for actor, name in self._leases(actor_id):
        source = self.root / "leased" / actor / name
        if finished(_task_id(name)):
          os.replace(source, self.root / "done" / _task_id(name))
        else:
          os.replace(source, self.root / "pending" / name)
          requeued += 1
      return requeued

  def keep_open(self, is_open: bool) -> None:
    """Whether more tasks will be added: while open, an empty pool means 'wait for the
    learner's next draws', not 'done' (see `exhausted`)."""
    with locked(self._lock):
      if is_open:
        atomic_write(self.root / "open", b"")
      elif (self.root / "open").exists():
        (self.root / "open").unlink()

  def exhausted(self) -> bool:
    """True when nothing is pending or leased and no more tasks will be added."""
    with locked(self._lock):
      return not (self._pending() or self._leases() or (self.root / "open").exists())

  def counts(self) -> dict[str, int]:
    with locked(self._lock):
      return {"pending": len(self._pending()), "leased": len(self._leases()),
              "done": len(os.listdir(self.root / "done"))}
