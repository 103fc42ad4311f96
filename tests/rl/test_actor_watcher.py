"""The actor watcher (c2jax.rl.actors.backends.Actors.watch): a failure of any kind while
checking the actors on its thread reaches the learner at its next check, naming it, and
the watching ends instead of dying unseen."""

import time

import ml_collections
import pytest

from c2jax.rl.actors import backends, rollouts


class _BrokenSpawn(backends.Actors):
  """One actor that exits 1 at once; restarting it fails as Popen would (EMFILE)."""

  def __init__(self, cfg, dirs):
    super().__init__(cfg, dirs, "unused")
    self.exits = {"actor0": 1}

  def _spawn(self, actor_id):
    raise OSError(24, "Too many open files")

  def _exited(self):
    exits, self.exits = self.exits, {}
    return exits

  def _stop(self):
    pass


class _Pool:
  def requeue(self, actor_id, finished):
    return 0


class _Queue:
  def contains(self, group_id):
    return False


def test_an_error_on_the_watcher_thread_reaches_the_learner(tmp_path):
  cfg = ml_collections.ConfigDict(dict(actors=dict(count=1, restarts=3)))
  actors = _BrokenSpawn(cfg, rollouts.RunDirs(tmp_path))
  actors.watch(_Pool(), _Queue(), every_s=0.01)
  deadline = time.time() + 10
  while actors._failure is None and time.time() < deadline:  # pylint: disable=protected-access
    time.sleep(0.01)
  with pytest.raises(backends.ActorFailure,
                     match="actor watcher failed: OSError: .*Too many open files"):
    actors.check(_Pool(), _Queue())
  actors.stop()
