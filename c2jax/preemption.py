"""Preemption: SIGTERM or SIGINT asks a run to stop cleanly at a step boundary.

    stop = preemption.StopRequest(jax_processes=True).install()
    try:
      for step in ...:
        state = step_fn(state, batch)
        if stop.reached(step):        # every process of the job answers alike
          save(step); break           # then exit 0; rerunning resumes from `step`

(or `stop = StopRequest(...).install()` ... `stop.uninstall()` in a `finally`.)

A preemptible VM, SLURM (`scancel`, the end of `--time`) and Kubernetes send SIGTERM some
time before they kill; a user sends SIGINT (Ctrl-C). Inside the context the first such
signal only records the request; the run finishes the step in flight, writes a checkpoint
and returns. A second signal of the same kind acts as it would without c2jax (SIGINT
raises KeyboardInterrupt, SIGTERM kills the process), for a run that must die now; a
repeat within REPEAT_WINDOW_S of the first counts as the same notice (a launcher that
signals every process and a parent that forwards the signal deliver it twice).

A job stopped this way writes MARKER (`preempted.json`) in its run directory and removes
it when it starts again, so a caller that sees exit status 0 (`c2jax sweep`) can tell a
stopped run from a finished one (`was_preempted`).

With several jax.distributed processes every process must stop at the same step, or the
ones still stepping wait for ever in a collective. `reached(step)` is then JAX's
preemption sync point (`multihost_utils.reached_preemption_sync_point`, the protocol
orbax's CheckpointManager and MaxText use): JAX's coordination service owns SIGTERM on
every process, spreads a notice to all of them, and they agree on the first step after
the largest step any of them had reached; SIGINT is forwarded to that SIGTERM handler.
Every process must therefore call `reached` once per step, with the same step numbers.
Where JAX's preemption service is off (`jax_enable_preemption_service=False`) the
processes agree instead through one tiny all-gather per step.

Jobs without devices (eval's runner, sweeps) use `jax_processes=False`: this module then
imports nothing but the standard library, and `requested` is the local flag.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import threading
import time

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_WINDOW_S = 2.0
MARKER = "preempted.json"


def mark(workdir, **info) -> None:
  """Records in `workdir` that its job stopped on a signal before finishing."""
  path = pathlib.Path(workdir) / MARKER
  path.write_text(json.dumps({**info, "time": round(time.time(), 3)}) + "\n")


def clear(workdir) -> None:
  """A job (re)starting in `workdir` is no longer a stopped one."""
  (pathlib.Path(workdir) / MARKER).unlink(missing_ok=True)


def was_preempted(workdir) -> bool:
  return (pathlib.Path(workdir) / MARKER).exists()


class StopRequest:
  """Catches SIGTERM and SIGINT while active (a context manager; main thread only)."""

  def __init__(self, *, jax_processes: bool = False):
    self._jax_processes = jax_processes
    self._requested: str | None = None
    self._first_at = 0.0
    self._previous: dict[int, object] = {}
    self._jax_sync = False  # JAX's preemption sync manager agrees on the step
    self._gather = False  # several processes without it: all-gather the flags per step

  @property
  def requested(self) -> bool:
    """Whether this process received a stop signal (its own view, not the job's)."""
    return self._requested is not None

  @property
  def signal_name(self) -> str | None:
    return self._requested

  def __enter__(self) -> StopRequest:
    return self.install()

  def __exit__(self, *exc) -> None:
    self.uninstall()

  def install(self) -> StopRequest:
    """Starts catching the signals (what `with` does); returns self."""
    owned = _SIGNALS
    if self._jax_processes:
      import jax  # pylint: disable=import-outside-toplevel  (device-free users skip jax)
      if jax.process_count() > 1:
        if jax.config.jax_enable_preemption_service:
          # JAX installed its SIGTERM notifier in jax.distributed.initialize; replacing
          # it would hide the notice from the other processes.
          self._jax_sync, owned = True, (signal.SIGINT,)
        else:
          self._gather = True
    if threading.current_thread() is not threading.main_thread():
      return self  # Python delivers signals to the main thread only; nothing to catch
    for signum in owned:
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def uninstall(self) -> None:
    """Gives the signals back to the handlers they had before `install`."""
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous.clear()

  def _handle(self, signum, frame) -> None:
    del frame
    name = signal.Signals(signum).name
    if self._requested == name and time.monotonic() - self._first_at < REPEAT_WINDOW_S:
      return  # the same notice delivered twice
    if self._requested == name:  # the second of a kind: behave as without c2jax
      signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
      if signum == signal.SIGINT:
        raise KeyboardInterrupt
      os.kill(os.getpid(), signum)
      return
    first = self._requested is None
    self._requested = name
    if first:
      self._first_at = time.monotonic()
      print(f"preemption: {name} received; finishing the work in flight, saving it, "
            "then exiting (send it again to stop at once)", flush=True)
    if self._jax_sync and signum == signal.SIGINT:
      os.kill(os.getpid(), signal.SIGTERM)  # JAX's notifier tells the other processes

  def reached(self, step: int) -> bool:
    """Whether the job stops after `step`. Single process: a signal was received. Several
    jax.distributed processes: a collective every process calls once per step; all get
    the same answer."""
    if self._jax_sync:
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      return bool(multihost_utils.reached_preemption_sync_point(step))
    if self._gather:
      import numpy as np  # pylint: disable=import-outside-toplevel
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      flags = multihost_utils.process_allgather(np.int32(self.requested))
      return bool(np.asarray(flags).any())
    return self.requested
