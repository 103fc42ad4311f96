"""Serving a policy that keeps training: follow the RL learner's published weights.

`c2jax serve --model RL_RUN --follow_weights RL_RUN/weights/<run>` polls the directory the
learner's WeightPublisher writes (c2jax/rollout/weights.py) and stages every newer version in
the engine, which swaps it in between decode steps exactly as a rollout actor does: a
request in flight continues on the new weights, and each sampled token's policy version
(in the capture) says which weights produced it, so the learner can bound staleness.
"""

from __future__ import annotations

import threading

from absl import logging

from c2jax.rollout import Engine
from c2jax.rollout import weights as weights_lib


class WeightFollower:
  """Polls `directory` every `interval_s` on a daemon thread until `stop()`."""

  def __init__(self, engine: Engine, directory: str, interval_s: float = 2.0):
    if interval_s <= 0:
      raise ValueError(f"weight poll interval = {interval_s}s; use a positive number.")
    self.engine, self.interval_s = engine, interval_s
    self.subscriber = weights_lib.WeightSubscriber(directory)
    self._errors = (weights_lib.WeightSyncError, OSError, ValueError)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="c2jax-weights", daemon=True)
    self.installed: int | None = None  # the last version staged

  def start(self) -> "WeightFollower":
    self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()
    self._thread.join(30)

  def poll_once(self) -> int | None:
    """Stages the newest version if it is new; returns it (else None)."""
    update = self.subscriber.poll()
    if update is None:
      return None
    params, version = update
    self.engine.update_params(params, version)
    self.installed = version
    logging.info("serve: staged weights version %d from %s", version,
                 self.subscriber.directory)
    return version

  def _run(self) -> None:
    while not self._stop.is_set():
      try:
        self.poll_once()
      except self._errors as e:  # keep serving the weights we have; say why
        logging.warning("serve: cannot load weights from %s (%s); still serving version "
                        "%d", self.subscriber.directory, e, self.engine.version)
      self._stop.wait(self.interval_s)
