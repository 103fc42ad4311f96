"""What every set of rollout actors does, whatever starts them (backends.py: local
processes; ray_actors.py: Ray tasks): start, watch, requeue a dead actor's prompts and
restart it up to config.actors.restarts times (see backends.py). Backends register
themselves by name (`register`) in ACTOR_BACKENDS."""

from __future__ import annotations

import abc
import threading

from c2jax.rl.actors import rollouts

# Seconds the other processes of a multi-process actor get to finish after process 0
# exits cleanly (it stopped them: they leave their loops at once).
FOLLOWERS_EXIT_S = 60.0

ACTOR_BACKENDS: dict[str, type] = {}


def register(name: str):
  def wrap(cls):
    ACTOR_BACKENDS[name] = cls
    return cls
  return wrap


class ActorFailure(RuntimeError):
  """An actor kept dying; the message carries its last output."""


class Actors(abc.ABC):

  def __init__(self, cfg, dirs: rollouts.RunDirs, weights_dir: str):
    self.cfg, self.dirs, self.weights_dir = cfg, dirs, weights_dir
    self.ids = [f"actor{i}" for i in range(cfg.actors.count)]
    self.restarts = {actor_id: 0 for actor_id in self.ids}
    self.finished: set[str] = set()
    dirs.actors.mkdir(parents=True, exist_ok=True)
    self._lock = threading.RLock()  # the watcher thread and the learner both check
    self._watcher: threading.Thread | None = None
    self._watching = threading.Event()
    self._failure: ActorFailure | None = None

  @abc.abstractmethod
  def _spawn(self, actor_id: str) -> None:
    """Starts one actor."""

  @abc.abstractmethod
  def _exited(self) -> dict[str, int]:
    """{actor_id: exit status} of actors that stopped since the last call."""

  @abc.abstractmethod
  def _stop(self) -> None:
    """Stops every actor (idempotent)."""

  def stop(self) -> None:
    """Stops the watcher, then every actor (idempotent)."""
    self._stop_watching()
    with self._lock:
      self._stop()

  def start(self) -> None:
    for actor_id in self.ids:
      self._spawn(actor_id)

  def log_tail(self, actor_id: str, chars: int = 3000) -> str:
    path = self.dirs.actors / f"{actor_id}.log"
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no output)"

  def watch(self, pool, queue, every_s: float) -> None:
    """Checks on the actors every `every_s` seconds on a daemon thread until `stop`."""
    def loop():
      while not self._watching.wait(every_s):
        try:
          self.check(pool, queue)
        except ActorFailure as failure:
          self._failure = failure  # raised on the learner's thread by its next check()
          return
        except Exception as err:  # pylint: disable=broad-except
          # Anything else (the run directory unwritable, no process could be started)
          # must not end the watching silently: the learner raises it at its next check.
          self._failure = ActorFailure(
              f"the actor watcher failed: {type(err).__name__}: {err}")
          return

    self._watching.clear()
    self._watcher = threading.Thread(target=loop, name="actor-watcher", daemon=True)
    self._watcher.start()

  def _stop_watching(self) -> None:
    self._watching.set()
    if self._watcher is not None and self._watcher is not threading.current_thread():
      self._watcher.join()
    self._watcher = None

  def check(self, pool, queue) -> None:
    """Requeues dead actors' prompts and restarts them (see the module docstring)."""
    if self._failure is not None:
      raise self._failure
    with self._lock:
      self._check(pool, queue)

  def _check(self, pool, queue) -> None:
    for actor_id, status in self._exited().items():
      returned = pool.requeue(actor_id, finished=queue.contains)
      if status == 0:
        self.finished.add(actor_id)
        continue
      if self.restarts[actor_id] >= self.cfg.actors.restarts:
        raise ActorFailure(
            f"{actor_id} died (status {status}){self._where(actor_id)} after "
            f"{self.restarts[actor_id]} restarts "
            f"(config.actors.restarts). Its last output:\n{self.log_tail(actor_id)}")
      self.restarts[actor_id] += 1
      print(f"rl: {actor_id} died (status {status}){self._where(actor_id)}; {returned} "
            f"prompt(s) back in the pool; restart {self.restarts[actor_id]}/"
            f"{self.cfg.actors.restarts}", flush=True)
      self._spawn(actor_id)

  def _where(self, actor_id: str) -> str:  # pylint: disable=unused-argument
    """' on <host>...' for a backend whose actors run on other machines, else ''."""
    return ""

  @property
  def all_finished(self) -> bool:
    return self.finished == set(self.ids)
