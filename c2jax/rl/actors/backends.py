"""Starting, watching and restarting rollout actors: local processes or Ray tasks
(ray_actors.py).

Both backends run the same actor loop (`c2jax.rl.actors.actor.serve`): local processes read
the run directory; Ray tasks reach it only through Ray (c2jax.rl.actors.ray_link), so they
may run on machines without a shared file system. `check()` finds dead actors: their
leased prompts go back to the pool (except those whose group already reached the queue),
and each is restarted up to `config.actors.restarts` times before the run fails with the
actor's last output. The learner runs it every `config.actors.check_every_s` seconds on
a watcher thread (`watch`), whatever the queue holds, so a dead actor is noticed within
that time even while the learner trains on a full queue; an actor that kept dying
surfaces as ActorFailure at the learner's next `check()`.
"""

from __future__ import annotations

import os
import subprocess
import sys

from c2jax.rl.actors import actor_set
from c2jax.rl.actors.actor_set import ACTOR_BACKENDS, ActorFailure, Actors, register
# The 'ray' backend registers itself on import (Ray itself is imported when it starts).
from c2jax.rl.actors.ray_actors import RayActors

__all__ = ["ACTOR_BACKENDS", "ActorFailure", "Actors", "ProcessActors", "RayActors",
           "make_actors", "register"]


@register("process")
class ProcessActors(Actors):
  """Actors as child processes of the learner (they die with it). With
  config.actors.processes = N > 1 an actor is N processes of one jax.distributed job of
  their own (a coordinator port of their own; logs actorK.log for process 0, actorK.pN.log
  for the others): process 0 rolls out, the others follow its engine. The group lives and
  dies whole: when one process ends non-zero the others are stopped, the actor counts as
  died (its leased prompt returns to the pool) and is restarted whole."""

  FOLLOWERS_EXIT_S = actor_set.FOLLOWERS_EXIT_S

  def __init__(self, cfg, dirs, weights_dir):
    super().__init__(cfg, dirs, weights_dir)
    self.processes: dict[str, list[subprocess.Popen]] = {}
    self._died: dict[str, str] = {}  # actor id -> which of its processes ended first

  def _spawn(self, actor_id: str) -> None:
    from c2jax.parallel import distributed  # pylint: disable=g-import-not-at-top

    # An actor is not a process of the learner's jax.distributed job.
    env = {k: v for k, v in os.environ.items() if k not in distributed.ENV.values()}
    import jax  # pylint: disable=g-import-not-at-top

    count = int(self.cfg.actors.processes)
    if jax.default_backend() == "cpu":
      # Actors and the learner share the host's cores: one compute thread per actor
      # keeps them from oversubscribing it.
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                          "intra_op_parallelism_threads=1").strip()
    command = [sys.executable, "-m", "c2jax.rl.actors.actor", f"--workdir={self.dirs.root}",
               f"--actor_id={actor_id}", f"--weights={self.weights_dir}",
               f"--parent_pid={os.getpid()}"]
    group_env = [env]
    if count > 1:
      port = _free_port()
      group_env = [dict(env, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                        JAX_NUM_PROCESSES=str(count), JAX_PROCESS_ID=str(rank))
                   for rank in range(count)]
    group = []
    for rank, process_env in enumerate(group_env):
      name = f"{actor_id}.log" if rank == 0 else f"{actor_id}.p{rank}.log"
      log = open(self.dirs.actors / name, "ab")  # pylint: disable=consider-using-with
      # Its own session: a Ctrl-C meant for the learner (which then stops the actors
      # itself, c2jax.preemption) does not kill the actors' rollouts first.
      group.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                    env=process_env, start_new_session=True))
      log.close()
    self.processes[actor_id] = group

  def pid(self, actor_id: str, process: int = 0) -> int:
    """The pid of one of the actor's processes (0: the one that rolls out)."""
    return self.processes[actor_id][process].pid

  def _exited(self) -> dict[str, int]:
    exited = {}
    for actor_id, group in list(self.processes.items()):
      statuses = [process.poll() for process in group]
      if all(status is None for status in statuses):
        continue
      if statuses[0] == 0:  # process 0 finished: its followers leave their loops too
        for process in group[1:]:
          try:
            process.wait(timeout=self.FOLLOWERS_EXIT_S)
          except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        statuses = [process.returncode for process in group]
      failed = [(rank, status) for rank, status in enumerate(statuses)
                if status is not None and status != 0]
      if failed:
        rank, status = failed[0]
        if len(group) > 1:
          self._died[actor_id] = f" (process {rank} of {len(group)} ended first)"
        _end(group)
      else:
        status = 0
      exited[actor_id] = status
      del self.processes[actor_id]
    return exited

  def _where(self, actor_id: str) -> str:
    return self._died.pop(actor_id, "")

  def _stop(self) -> None:
    for group in self.processes.values():
      _end(group)
    self.processes.clear()


def _end(group: list[subprocess.Popen]) -> None:
  """Terminates the processes still running (killed after 10 s) and reaps all."""
  for process in group:
    if process.poll() is None:
      process.terminate()
  for process in group:
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()


def _free_port() -> int:
  import socket  # pylint: disable=g-import-not-at-top

  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def make_actors(cfg, dirs, weights_dir) -> Actors:
  return ACTOR_BACKENDS[cfg.actors.backend](cfg, dirs, weights_dir)
