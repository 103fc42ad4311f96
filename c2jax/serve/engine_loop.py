"""One thread owns the engine and drives continuous batching for every HTTP request.

JAX engines are not thread-safe and a decode step should advance every live request at
once, so HTTP handlers never touch the engine: they `submit` a rollout Request and read
events from their Stream; the engine thread admits new requests into free slots between
decode steps, runs one step over all of them, and pushes each request's new tokens to its
stream. A stream that is cancelled (its client went away) has its sequence cancelled in
the engine before the next step, which frees its slot.

Events a stream receives, in order: ("tokens", ids, logprobs) zero or more times (the
tokens sampled since the last event; for a Stream made with tokens=False only once,
just before "done"), then exactly one of ("done", Generation) or ("error", exception).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from absl import logging

from c2jax.rollout import Engine, Request
from c2jax.train import profiling

Event = tuple


class EngineUnavailable(RuntimeError):
  """The engine cannot run any more (a process of an engine over several processes is
  gone): the server answers 503 and stops."""


class Stream:
  """One request's event channel. `deliver` is called on the engine thread; it must be
  cheap and thread-safe (the server passes loop.call_soon_threadsafe into an asyncio
  queue)."""

  def __init__(self, request: Request, deliver: Callable[[Event], None], *,
               tokens: bool = True):
    self.request = request
    self.deliver = deliver
    self.tokens = tokens  # False: only the final event (no per-step wake-ups)
    self.seq_id: int | None = None
    self.sent = 0  # tokens already delivered
    self.cancelled = False
    self.first_token: float | None = None  # unix time the first token was sampled


class EngineLoop:
  """Runs `engine` on a daemon thread until `stop()`."""

  def __init__(self, engine: Engine, trace: profiling.StepTrace | None = None,
               on_fatal: Callable[[Exception], None] | None = None):
    """trace: `c2jax serve --profile_steps`: a jax.profiler trace of those engine steps.
    on_fatal: called (on the engine thread) when a step fails and the engine cannot go
    on (an engine over several processes: a failed program means a process is gone);
    live and later requests then get EngineUnavailable. Without it a failed step fails
    its live requests and the loop goes on."""
    self.engine = engine
    self.trace = trace
    self.on_fatal = on_fatal
    self.failed: EngineUnavailable | None = None
    self._inbox: collections.deque[Stream] = collections.deque()
    self._cancels: collections.deque[Stream] = collections.deque()
    self._jobs: collections.deque = collections.deque()  # (fn, deliver) to run
    self._wake = threading.Condition()
    self._live: dict[int, Stream] = {}
    self._stopping = False
    self._thread = threading.Thread(target=self._run, name="c2jax-engine", daemon=True)
    self._running_job: Callable[[Event], None] | None = None  # its deliver, while it runs
    self.steps = 0

  def start(self) -> "EngineLoop":
    self._thread.start()
    return self

  def stop(self, timeout: float = 10.0) -> None:
    with self._wake:
      self._stopping = True
      self._wake.notify()
    if self._thread.is_alive():  # a loop never started has nothing to wait for
      self._thread.join(timeout)

  @property
  def live(self) -> int:
    """Requests admitted to the engine and not yet finished (read from any thread)."""
    return len(self._live)

  def submit(self, stream: Stream) -> Stream:
    with self._wake:
      if self.failed is not None:
        raise self.failed
      if self._stopping:
        raise RuntimeError("the engine loop is stopped; start a new server.")
      self._inbox.append(stream)
      self._wake.notify()
    return stream

  def cancel(self, stream: Stream) -> None:
    """Abandons a request (safe from any thread, any time, more than once)."""
    with self._wake:
      stream.cancelled = True
      self._cancels.append(stream)
      self._wake.notify()

  def call(self, fn: Callable[[Engine], object], deliver: Callable[[Event], None]) -> None:
    """Runs fn(engine) on the engine thread between steps (e.g. scoring a prompt);
    delivers ("result", value) or ("error", exception)."""
    with self._wake:
      if self.failed is not None:
        raise self.failed
      if self._stopping:
        raise RuntimeError("the engine loop is stopped; start a new server.")
      self._jobs.append((fn, deliver))
      self._wake.notify()

  def fail(self, error: Exception) -> None:
    """From another thread, while the engine thread is stuck inside the engine (an
    engine over several processes whose watchdog found a program that never completes,
    lockstep.EngineHang): the live, queued and running requests, and later ones, get
    EngineUnavailable; then on_fatal."""
    with self._wake:
      self.failed = EngineUnavailable(f"the engine is stuck and the server is stopping: "
                                      f"{error}")
      self.failed.__cause__ = error
      streams = list(self._live.values()) + list(self._inbox)
      delivers = [d for _, d in self._jobs]
      if self._running_job is not None:
        delivers.append(self._running_job)
      self._live, self._inbox, self._jobs = {}, collections.deque(), collections.deque()
    for stream in streams:
      stream.deliver(("error", self.failed))
    for deliver in delivers:
      deliver(("error", self.failed))
    if self.on_fatal is not None:
      self.on_fatal(self.failed)

  # ---- the engine thread ----------------------------------------------------------------
  def _run(self) -> None:
    while True:
      with self._wake:
        while not (self._stopping or self._inbox or self._cancels or self._jobs
                   or self.engine.busy):
          self._wake.wait()
        if self._stopping:
          break
        inbox, self._inbox = self._inbox, collections.deque()
        cancels, self._cancels = self._cancels, collections.deque()
        jobs, self._jobs = self._jobs, collections.deque()
      for fn, deliver in jobs:
        self._running_job = deliver
        try:
          deliver(("result", fn(self.engine)))
        except Exception as e:  # pylint: disable=broad-except
          deliver(("error", e))
        self._running_job = None
      for stream in cancels:
        self._drop(stream)
      for stream in inbox:
        self._admit(stream)
      if self.engine.busy:
        self._step()
    if self.trace is not None:
      self.trace.close()
    for stream in list(self._live.values()) + list(self._inbox):
      stream.deliver(("error", RuntimeError("the server is shutting down.")))

  def _admit(self, stream: Stream) -> None:
    if stream.cancelled:
      return
    try:
      stream.seq_id = self.engine.submit(stream.request)
    except ValueError as e:
      stream.deliver(("error", e))
      return
    self._live[stream.seq_id] = stream

  def _drop(self, stream: Stream) -> None:
    if stream.seq_id is not None and self._live.pop(stream.seq_id, None) is stream:
      self.engine.cancel(stream.seq_id)

  def _step(self) -> None:
    if self.trace is not None:
      self.trace.before(self.steps + 1)
    try:
      with profiling.span("serve/step"):
        finished = self.engine.step()
    except Exception as e:  # pylint: disable=broad-except
      # A failed step leaves the engine's state unknown: fail every live request loudly
      # rather than hang them, and keep the thread alive for the log line.
      logging.exception("engine step failed")
      if self.on_fatal is not None:
        self.failed = EngineUnavailable(f"the engine failed and the server is stopping: {e}")
        e = self.failed
      for seq_id, stream in list(self._live.items()):
        stream.deliver(("error", e))
        self._live.pop(seq_id)
        try:
          self.engine.cancel(seq_id)
        except ValueError:
          pass
      if self.on_fatal is not None:
        self.on_fatal(self.failed)
      return
    self.steps += 1
    if self.trace is not None:
      self.trace.after(self.steps)
    now = time.time()
    done = {g.seq_id: g for g in finished}
    for seq_id, stream in list(self._live.items()):
      generation = done.get(seq_id)
      if stream.first_token is None and (generation is not None
                                         or self.engine.progress(seq_id)[0]):
        stream.first_token = now
      if generation is None and not stream.tokens:
        continue
      if generation is not None:
        tokens, logprobs = generation.tokens.tolist(), generation.logprobs.tolist()
      else:
        tokens, logprobs = self.engine.progress(seq_id)
      if len(tokens) > stream.sent:
        stream.deliver(("tokens", tokens[stream.sent:], logprobs[stream.sent:]))
        stream.sent = len(tokens)
      if generation is not None:
        del self._live[seq_id]
        stream.deliver(("done", generation))
