"""The 'ray' actor backend: rollout actors as Ray tasks on any node of a Ray cluster
(actor_set.py has what every backend does, backends.py the 'process' backend; ray_link the
hub through which the tasks reach the run)."""

from __future__ import annotations

import os

from c2jax.rl.actors import actor_set


@actor_set.register("ray")
class RayActors(actor_set.Actors):
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
              self._ray.get(ref, timeout=actor_set.FOLLOWERS_EXIT_S)
            except Exception:  # pylint: disable=broad-except
              self._ray.cancel(ref, force=True)
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
