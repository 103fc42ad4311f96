"""One engine over several JAX processes: process 0 schedules, every process runs the
same programs, in the same order.

An engine whose mesh spans the devices of several processes (started with
`jax.distributed`; c2jax.parallel.distributed) runs each of its programs as one SPMD
program that every process must enter. Only process 0, the leader, holds the scheduler
(requests, slots, stop rules, the HTTP server or the actor's episodes). Before each
program it runs, the leader publishes a command (the program's name and its host inputs:
token chunks, slot numbers, sampling settings, all small numpy values) under the next
sequence number in the distributed runtime's key-value store; every other process (a
follower, `JaxEngine.follow`) reads the commands in order and runs the same program on the
same inputs, with its own shards of the weights and KV cache. The programs' outputs are
replicated, so the leader reads them; followers drop theirs.

Commands besides programs: 'swap' (new weights, by version: each process loads them
itself, e.g. from the RL weight directory) and 'stop' (the followers return; the leader
waits at a barrier until every follower has read it, so it never exits, taking the
coordination service of process 0 with it, while a follower still waits). A command is
deleted once the program after it has completed: an SPMD program completes only after
every process has entered it, so every follower has read everything before it.

Waiting: a follower waits `poll_s` at a time for the next command, as long as it takes
(a server may idle for hours), and returns an error if the distributed runtime reports
the leader gone. `send` never blocks.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import jax

_PREFIX = "c2jax/engine"


class LeaderGone(RuntimeError):
  """The leader stopped publishing because its process is gone."""


def _client():
  from jax._src import distributed  # pylint: disable=g-import-not-at-top

  client = distributed.global_state.client
  if client is None:
    raise RuntimeError("A multi-process engine needs jax.distributed initialised "
                       "(c2jax.parallel.distributed.initialize) before it is built.")
  return client


def spans_processes(mesh) -> bool:
  """Whether `mesh` holds devices of more than one process."""
  return len({d.process_index for d in mesh.devices.flat}) > 1


def share(key: str, value: str | None, timeout_s: float = 600.0) -> str:
  """Process 0 publishes `value` under `key`; every process returns it (the others wait
  up to `timeout_s`): what the processes of an engine must agree on before it exists
  (e.g. the weight version it starts from)."""
  client = _client()
  key = f"{_PREFIX}/shared/{key}"
  if jax.process_index() == 0:
    client.key_value_set(key, str(value))
    return str(value)
  return client.blocking_key_value_get(key, int(timeout_s * 1000))


class Lockstep:
  """The command channel of one engine: `send` on the leader, `receive` on followers.

  `name` keeps the keys of engines built one after another apart (each engine of a job
  gets the next one, in the same order on every process)."""

  _built = 0

  def __init__(self, name: str | None = None, poll_s: float = 10.0):
    Lockstep._built += 1
    self.name = name or f"e{Lockstep._built}"
    self.leader = jax.process_index() == 0
    self.poll_s = poll_s
    self._client = _client()
    self._next = 0  # the next command's sequence number
    self._unsynced: list[int] = []  # sent, not yet known to be read by every follower
    self._lock = threading.Lock()  # a server's engine thread and its main thread send

  def _key(self, number: int) -> str:
    return f"{_PREFIX}/{self.name}/{number:012d}"

  def send(self, op: str, *args: Any) -> None:
    """Leader: publish command (op, args); args are picklable host values."""
    if not self.leader:
      raise RuntimeError("Only the leader (process 0) sends engine commands.")
    with self._lock:
      self._client.key_value_set_bytes(self._key(self._next),
                                       pickle.dumps((op, args), protocol=5))
      self._unsynced.append(self._next)
      self._next += 1

  def synced(self) -> None:
    """Leader, after a program completed: every follower has read every command up to
    it; their keys go."""
    with self._lock:
      done, self._unsynced = self._unsynced, []
    for number in done:
      self._client.key_value_delete(self._key(number))

  def stop(self, timeout_s: float = 300.0) -> None:
    """Leader: the followers' last command; returns once every follower has read it."""
    self.send("stop")
    self.stopped(timeout_s)

  def stopped(self, timeout_s: float = 300.0) -> None:
    """Both sides of 'stop': the barrier every process of the engine passes after it."""
    self._client.wait_at_barrier(f"{_PREFIX}/{self.name}/stopped", int(timeout_s * 1000))

  def receive(self) -> tuple[str, tuple]:
    """Follower: the next command, waiting as long as the leader lives."""
    key = self._key(self._next)
    while True:
      try:
        payload = self._client.blocking_key_value_get_bytes(key, int(self.poll_s * 1000))
        break
      except Exception as err:  # pylint: disable=broad-except
        text = str(err)
        if "DEADLINE_EXCEEDED" in text or "Deadline" in text:
          continue
        raise LeaderGone(f"engine follower (process {jax.process_index()}) lost the "
                         f"leader, process 0, waiting for command {self._next}: "
                         f"{text}") from err
    self._next += 1
    return pickle.loads(payload)
