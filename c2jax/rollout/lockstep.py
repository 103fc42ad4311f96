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

Hangs (Watchdog): a process that dies or freezes is caught by JAX's coordination service
(its heartbeats stop; every process of the job is then ended). A process that lives but
never enters the next program (stuck loading weights, or in a bug of its own) holds the
others inside that program's collectives for ever. So every process reports, every few
seconds, what it is doing (`running`: a program, a weight swap); once one of them has
lasted `timeout_s`, the process reads every report and calls `on_hang` with an EngineHang
naming the processes that are elsewhere (by default it prints that and exits 1). The first
call of each program shape is not timed (it compiles, which may take long on a large model);
a step of one process alone (loading weights) gets twice the time, so the processes it
holds up name it first.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import socket
import sys
import threading
import time
from typing import Any, Callable

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


class EngineHang(RuntimeError):
  """A program or weight swap of an engine over several processes did not complete within
  the watchdog's timeout; `processes` names the processes that held it up."""

  def __init__(self, message: str, processes: list[int]):
    super().__init__(message)
    self.processes = processes


def exit_on_hang(hang: EngineHang) -> None:
  """The default `on_hang`: the process cannot leave the program it waits in, so it says
  why and exits 1 (a supervisor, e.g. the RL actor group's, restarts the engine whole)."""
  print(f"c2jax engine: {hang}", file=sys.stderr, flush=True)
  os._exit(1)  # pylint: disable=protected-access


class Watchdog:
  """What this process of an engine over several processes is doing, reported to the
  others every `poll_s` (a key per process in the key-value store); after `timeout_s` in
  one timed activity, `on_hang(EngineHang)` (see the module's docstring)."""

  def __init__(self, prefix: str, client, timeout_s: float,
               on_hang: Callable[[EngineHang], None] | None = None, poll_s: float | None = None):
    if timeout_s <= 0:
      raise ValueError(f"hang_timeout_s = {timeout_s}; give a positive number of seconds.")
    self.timeout_s = timeout_s
    self.poll_s = poll_s if poll_s is not None else min(10.0, timeout_s / 4)
    self.on_hang = on_hang or exit_on_hang
    self._prefix, self._client = prefix, client
    self._process, self._processes = jax.process_index(), jax.process_count()
    # (what, command number, started (monotonic), timed, collective) or None.
    self._doing: tuple | None = None
    self._stopped = threading.Event()
    self._thread = threading.Thread(target=self._run, name="c2jax-engine-watchdog",
                                    daemon=True)
    self._thread.start()

  @contextlib.contextmanager
  def running(self, what: str, command: int, *, timed: bool = True,
              collective: bool = True):
    """Reports `what` (at command number `command`) while the block runs. `timed`: the
    watchdog's clock runs (not for a first call that compiles); `collective`: every
    process takes part (a program, placing weights), not a step of this process alone
    (loading weights)."""
    self._doing = (what, command, time.monotonic(), timed, collective)
    try:
      yield
    finally:
      self._doing = None

  def stop(self) -> None:
    self._stopped.set()

  def _report(self, doing) -> dict:
    now = time.monotonic()
    what, command, started = doing[:3] if doing else (None, None, now)
    return {"what": what, "command": command, "for_s": round(now - started, 1),
            "at": time.time(), "host": socket.gethostname(), "pid": os.getpid()}

  def _run(self) -> None:
    key = f"{self._prefix}/where/{self._process:06d}"
    while not self._stopped.wait(self.poll_s):
      doing = self._doing
      try:
        self._client.key_value_set(key, json.dumps(self._report(doing)),
                                   allow_overwrite=True)
      except Exception:  # pylint: disable=broad-except
        continue  # the coordination service is gone: JAX's own error path ends the job
      # A step of this process alone gets twice as long: the processes it holds up in
      # their next program see the hang first, and name it from the reports of all.
      limit = self.timeout_s * (1 if doing is None or doing[4] else 2)
      if doing is not None and doing[3] and time.monotonic() - doing[2] > limit:
        self.on_hang(self._diagnose(doing))
        return

  def _diagnose(self, doing) -> EngineHang:
    what, command, started, _, collective = doing
    mine = (f"{what} (engine command {command}) has not completed in "
            f"{time.monotonic() - started:.0f} s (hang timeout {self.timeout_s:g} s) on "
            f"process {self._process}")
    if not collective:  # a step of this process alone: it is the one holding the others
      return EngineHang(f"{mine}, a step of this process alone: the other processes wait "
                        "for it in their next program.", [self._process])
    try:
      reports = {int(k.rsplit("/", 1)[1]): json.loads(v)
                 for k, v in self._client.key_value_dir_get(f"{self._prefix}/where/")}
    except Exception as e:  # pylint: disable=broad-except
      return EngineHang(f"{mine}; the other processes' reports could not be read ({e}).",
                        [])
    late, lines = [], []
    for rank in range(self._processes):
      if rank == self._process:
        continue
      r = reports.get(rank)
      if r is None:
        late.append(rank)
        lines.append(f"process {rank}: no report (never got this far, or frozen)")
        continue
      silent = time.time() - r["at"]
      where = (f"{r['what']} (command {r['command']}) for {r['for_s']:.0f} s"
               if r["what"] else "between programs")
      if silent > 3 * self.poll_s:
        late.append(rank)
        lines.append(f"process {rank} ({r['host']}, pid {r['pid']}): silent for "
                     f"{silent:.0f} s; last {where}")
      elif (r["what"], r["command"]) != (what, command):
        late.append(rank)
        lines.append(f"process {rank} ({r['host']}, pid {r['pid']}): {where}")
    if late:
      return EngineHang(f"{mine}, waiting for {', '.join(f'process {p}' for p in late)}: "
                        + "; ".join(lines) + ".", late)
    return EngineHang(f"{mine}; every process is inside it: a collective that never "
                      "completes (a broken link between hosts?).",
                      list(range(self._processes)))


class Lockstep:
  """The command channel of one engine: `send` on the leader, `receive` on followers.

  `name` keeps the keys of engines built one after another apart (each engine of a job
  gets the next one, in the same order on every process)."""

  _built = 0

  def __init__(self, name: str | None = None, poll_s: float = 10.0,
               hang_timeout_s: float | None = None,
               on_hang: Callable[[EngineHang], None] | None = None):
    Lockstep._built += 1
    self.name = name or f"e{Lockstep._built}"
    self.leader = jax.process_index() == 0
    self.poll_s = poll_s
    self._client = _client()
    self._next = 0  # the next command's sequence number
    self._unsynced: list[int] = []  # sent, not yet known to be read by every follower
    self._lock = threading.Lock()  # a server's engine thread and its main thread send
    self.watchdog = (None if hang_timeout_s is None else
                     Watchdog(f"{_PREFIX}/{self.name}", self._client, hang_timeout_s, on_hang))
    self._warm: set = set()  # `running`'s compiles keys seen here

  def running(self, what: str, compiles: Any = None, collective: bool = True):
    """The watchdog's view of the block (see Watchdog.running), at the last command sent
    or received. `compiles`: a key of what the block compiles on its first run (a
    program and its input shapes): that first run is not timed."""
    if self.watchdog is None:
      return contextlib.nullcontext()
    timed = compiles is None or compiles in self._warm
    if compiles is not None:
      self._warm.add(compiles)  # timed from the next run on
    return self.watchdog.running(what, self._next - 1, timed=timed, collective=collective)

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
    if self.watchdog is not None:
      self.watchdog.stop()
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
