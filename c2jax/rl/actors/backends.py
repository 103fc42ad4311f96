"""Starting, watching and restarting rollout actors: local processes or Ray tasks.

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

import abc
import os
import subprocess
import sys
import threading

from c2jax.rl.actors import rollouts

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


@register("process")
class ProcessActors(Actors):
  """Actors as child processes of the learner (they die with it). With
  config.actors.processes = N > 1 an actor is N processes of one jax.distributed job of
  their own (a coordinator port of their own; logs actorK.log for process 0, actorK.pN.log
  for the others): process 0 rolls out, the others follow its engine. The group lives and
  dies whole: when one process ends non-zero the others are stopped, the actor counts as
  died (its leased prompt returns to the pool) and is restarted whole."""

  # Seconds the other processes of a group get to finish after process 0 exits cleanly
  # (it stopped them: they leave their loops at once).
  FOLLOWERS_EXIT_S = 60.0

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
      if count > 1:
        # JAX writes the compilation cache from process 0 only: a follower compiling
        # while process 0 loads would miss Gloo's 30 s rendezvous of the first collective.
        env["C2JAX_XLA_CACHE"] = "off"
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


@register("ray")
class RayActors(Actors):
  """Actors as Ray tasks (`pip install c2jax[ray]`) on any node of a Ray cluster
  (RAY_ADDRESS, or a local one). They share no disk with the learner: prompts, task
  repositories, finished groups and infra counts travel through a hub pinned to the
  learner's node (c2jax.rl.actors.ray_link), weights through config.actors.weights_dir (a
  gs:// / s3:// / file:// URL that every node can read). With config.actors.processes =
  N > 1 an actor is N tasks of one CPU each, on whichever nodes Ray picks, forming one
  jax.distributed job (ray_link: process 0 names its coordinator through the hub). The
  group lives and dies whole, as on the process backend: when one task fails or its node
  is lost, the others are cancelled, the actor's leased prompt returns to the pool and
  the actor is restarted whole, as a new job."""

  def __init__(self, cfg, dirs, weights_dir):
    try:
      import ray  # pylint: disable=g-import-not-at-top
      from ray.util import scheduling_strategies  # pylint: disable=g-import-not-at-top
    except ImportError as err:
      raise ImportError("config.actors.backend = 'ray' needs Ray: pip install 'c2jax[ray]' "
                        "(or use the default backend 'process').") from err
    super().__init__(cfg, dirs, weights_dir)
    self._ray = ray
    if not ray.is_initialized():
      ray.init(address=os.environ.get("RAY_ADDRESS"))
    from c2jax import data, storage  # pylint: disable=g-import-not-at-top
    from c2jax.rl.actors import ray_link  # pylint: disable=g-import-not-at-top

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1 and storage.local_path(weights_dir) is not None:
      print(f"rl: warning: weights go to {weights_dir}, a local path, but the Ray cluster "
            f"has {len(nodes)} nodes; actors on other nodes can read it only through a "
            "shared mount. Set config.actors.weights_dir to a gs:// or s3:// URL.",
            flush=True)

    here = scheduling_strategies.NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)
    # Threads: each actor waits on at most one call; spare ones for the learner's.
    self._hub = ray.remote(ray_link.RunHub).options(
        num_cpus=0, max_concurrency=2 * cfg.actors.count + 2, scheduling_strategy=here,
    ).remote(str(dirs.root), cfg.to_json())
    self._config_json = cfg.to_json()
    self._tokenizer = ray.put(data.prepare_from_config(cfg.data, progress=False).tokenizer())
    import jax  # pylint: disable=g-import-not-at-top

    env = {}
    self._count = int(cfg.actors.processes)
    if jax.default_backend() == "cpu":
      env["XLA_FLAGS"] = ("--xla_cpu_multi_thread_eigen=false "
                          "intra_op_parallelism_threads=1")
      if self._count > 1:  # as on the process backend (JAX caches from process 0 only)
        env["C2JAX_XLA_CACHE"] = "off"
    # Process N of a multi-process actor carries C2JAX_ACTOR_PROCESS=N; each such task has
    # a worker of its own that exits with it (max_calls=1): a jax.distributed job cannot be
    # joined twice by one process.
    def remote(rank: int):
      if self._count == 1:
        return ray.remote(ray_link.run_actor).options(
            num_cpus=1, max_retries=0, runtime_env={"env_vars": env} if env else None)
      return ray.remote(max_calls=1)(ray_link.run_actor).options(
          num_cpus=1, max_retries=0,
          runtime_env={"env_vars": dict(env, C2JAX_ACTOR_PROCESS=str(rank))})
    self._remotes = [remote(rank) for rank in range(self._count)]
    self.tasks: dict[str, list] = {}  # actor id -> its tasks' refs, process 0 first
    self._starts = 0
    self._lost: dict[str, str] = {}  # actor id -> where its failed task ran, for the log
    self._placed: dict[str, tuple[str, str, str]] = {}  # actor id -> hub.placement's

  def _spawn(self, actor_id: str) -> None:
    self._starts += 1
    incarnation = f"{actor_id}-{self._starts}"
    self.tasks[actor_id] = [
        remote.remote(self._hub, self._config_json, self._tokenizer, actor_id,
                      str(self.weights_dir), rank, incarnation)
        for rank, remote in enumerate(self._remotes)]

  def _placement(self, key: str, ref) -> tuple[str, str] | None:
    """(node id, address) the task `ref` (of actor process `key`: the actor id, with
    ".pN" for process N > 0) reported, None before it did; asked of the hub once per task
    (a task does not move)."""
    task_id = ref.task_id().hex()
    if self._placed.get(key, (None,))[0] != task_id:
      placed = self._ray.get(self._hub.placement.remote(key), timeout=30)
      if placed is None or placed[0] != task_id:
        return None  # an earlier task's, or none yet
      self._placed[key] = placed
    return self._placed[key][1:]

  def _status(self, actor_id: str, key: str, ref) -> int:
    """A finished task's exit status (1, logged, for one that raised or was lost)."""
    try:
      return int(self._ray.get(ref) or 0)
    except Exception as err:  # pylint: disable=broad-except
      with (self.dirs.actors / f"{actor_id}.log").open("a") as log:
        log.write(f"\n{key}: {err}\n")
      return 1

  def _exited(self) -> dict[str, int]:
    """Finished actors' statuses, and status 1 for an actor a task of which sits on a node
    Ray has declared dead: a host that loses its network keeps running, unreachable, and
    its task never returns, so its prompt would stay leased forever (the actor's tasks
    are cancelled here). An actor of several processes ends when process 0 does (its
    followers then leave their loops) or when any of its tasks fails or is lost; the
    others are then cancelled."""
    exited, alive = {}, None
    for actor_id, refs in list(self.tasks.items()):
      failed = None  # (process, status, where)
      done = {}
      for rank, ref in enumerate(refs):
        key = actor_id if rank == 0 else f"{actor_id}.p{rank}"
        ready, _ = self._ray.wait([ref], timeout=0)
        placed = self._placement(key, ref)
        if not ready:
          if placed is None:
            continue
          if alive is None:
            alive = {n["NodeID"] for n in self._ray.nodes() if n.get("Alive")}
          if placed[0] not in alive:
            with (self.dirs.actors / f"{actor_id}.log").open("a") as log:
              log.write(f"\nnode {placed[1]} declared dead by Ray; {key}'s task cancelled\n")
            failed = failed or (rank, 1, f" on node {placed[1]} (lost: Ray declared the "
                                         "node dead)")
          continue
        done[rank] = self._status(actor_id, key, ref)
        if done[rank] and failed is None:
          failed = (rank, done[rank], f" on node {placed[1]}" if placed else "")
      if failed is None and done.get(0) == 0 and len(refs) > 1:
        # Process 0 finished: it stopped its followers, which end at once.
        for rank, ref in enumerate(refs[1:], start=1):
          if rank not in done:
            try:
              self._ray.get(ref, timeout=ProcessActors.FOLLOWERS_EXIT_S)
            except Exception:  # pylint: disable=broad-except
              self._ray.cancel(ref, force=True)
        done = {rank: 0 for rank in range(len(refs))}
      if failed is not None:
        rank, status, where = failed
        if len(refs) > 1:
          where += f" (process {rank} of {len(refs)} ended first)"
        self._lost[actor_id] = where
        for ref in refs:
          self._ray.cancel(ref, force=True)
        exited[actor_id] = status
        del self.tasks[actor_id]
      elif done.get(0) == 0:
        exited[actor_id] = 0
        del self.tasks[actor_id]
    return exited

  def _where(self, actor_id: str) -> str:
    return self._lost.pop(actor_id, "")

  def _stop(self) -> None:
    for refs in self.tasks.values():
      for ref in refs:
        self._ray.cancel(ref, force=True)
    self.tasks.clear()
    if self._hub is not None:
      self._ray.kill(self._hub)
      self._hub = None


def make_actors(cfg, dirs, weights_dir) -> Actors:
  return ACTOR_BACKENDS[cfg.actors.backend](cfg, dirs, weights_dir)
