"""Actors on machines that share no disk with the learner: everything goes through Ray.

With `config.actors.backend = 'ray'` the learner starts one `RunHub` Ray actor pinned to
its own node. The hub owns nothing new: it calls the same disk-backed TaskPool and
GroupQueue the process backend uses, in the learner's run directory, so leases, the
queue's exactly-once bookkeeping (`GroupQueue.recover`, manifests) and a restarted
learner's recovery are unchanged. Rollout actors (Ray tasks running `run_actor`, on
any node) see the run only through the hub and a storage URL:

  prompts      hub.lease / complete / release        (no shared task pool directory)
  repositories hub.repo_archive: the task's repository as a tar, unpacked into the
               actor's own scratch directory         (no shared tasks/repos)
  groups       hub.put: the group's bytes, persisted by the learner's queue before the
               call returns; back-pressure by retrying while the queue is full
  infra counts hub.record_infra                      (c2jax.rl.actors.infra)
  placement    hub.placed: the node an actor's task started on, which the learner names
               when the task dies (a host lost from the network, say)
  coordinator  hub.set_coordinator / coordinator: an actor of several JAX processes
               (config.actors.processes) is that many Ray tasks, on any nodes; process 0
               picks the jax.distributed coordinator's address on its node and the others
               read it here (per incarnation: a restarted actor forms a new job)
  weights      a tensorstore URL (config.actors.weights_dir: gs://, s3://, file://)
  config and tokenizer: arguments of the Ray task.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import socket
import tarfile
import time

import ml_collections

from c2jax import compile_cache
from c2jax.env import scratch
from c2jax.rl.actors import infra
from c2jax.rl.actors import rollouts
from c2jax.rl.queue.group_store import Group

# Seconds one hub.put waits for room in the queue before the actor asks again (keeps no
# hub thread blocked on behalf of an actor that died).
_PUT_WAIT_S = 1.0


class RunHub:
  """The learner-side end of the link (a Ray actor; see the module docstring)."""

  def __init__(self, workdir: str, config_json: str):
    self.dirs = rollouts.RunDirs(pathlib.Path(workdir))
    cfg = ml_collections.ConfigDict(json.loads(config_json))
    self.pool, self.queue = self.dirs.pool(), self.dirs.queue(cfg)
    # actor id (".pN" for process N > 0 of a multi-process actor) -> (its current Ray
    # task's id, the Ray node id, the node's address)
    self.nodes: dict[str, tuple[str, str, str]] = {}
    self.coordinators: dict[tuple[str, str], str] = {}  # (actor id, incarnation) -> address

  def placed(self, actor_id: str, task_id: str, node_id: str, address: str) -> None:
    """Where an actor's task started (run_actor reports it first): the learner watches
    that node, and names the host when the task dies."""
    self.nodes[actor_id] = (task_id, node_id, address)

  def placement(self, actor_id: str) -> tuple[str, str, str] | None:
    return self.nodes.get(actor_id)

  def set_coordinator(self, actor_id: str, incarnation: str, address: str) -> None:
    self.coordinators = {key: value for key, value in self.coordinators.items()
                         if key[0] != actor_id}  # an earlier incarnation's is stale
    self.coordinators[(actor_id, incarnation)] = address

  def coordinator(self, actor_id: str, incarnation: str) -> str | None:
    return self.coordinators.get((actor_id, incarnation))

  def lease(self, actor_id: str):
    return self.pool.lease(actor_id)

  def counts(self) -> dict[str, int]:
    return self.pool.counts()

  def exhausted(self) -> bool:
    return self.pool.exhausted()

  def complete(self, actor_id: str, task_id: str) -> None:
    self.pool.complete(actor_id, task_id)

  def release(self, actor_id: str, task_id: str, max_releases: int | None = None) -> bool:
    return self.pool.release(actor_id, task_id, max_releases)

  def put(self, group_bytes: bytes) -> bool:
    """Queues a group (persisted on the learner's disk when this returns True); False
    when the queue stayed full for _PUT_WAIT_S (ask again)."""
    import queue as queue_lib  # pylint: disable=g-import-not-at-top

    try:
      self.queue.put(Group.from_bytes(group_bytes), timeout=_PUT_WAIT_S)
    except queue_lib.Full:
      return False
    return True

  def record_infra(self, actor_id: str, increments: dict[str, int]) -> dict[str, int]:
    return infra.record(self.dirs, actor_id, **increments)

  def repo_archive(self, repo: str) -> bytes:
    """A gzipped tar of one task repository under the run's tasks/repos."""
    root = self.dirs.repos.resolve()
    path = pathlib.Path(repo).resolve()
    if root not in path.parents or not path.is_dir():
      raise ValueError(f"{repo} is not a task repository of this run (under {root}).")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
      tar.add(path, arcname=".")
    return buffer.getvalue()


class _Remote:
  """Calls a hub method and waits for its answer."""

  def __init__(self, ray, hub):
    self._ray, self._hub = ray, hub

  def _call(self, name: str, *args):
    return self._ray.get(getattr(self._hub, name).remote(*args))


class RemotePool(_Remote):
  """The TaskPool methods an actor uses, answered by the hub."""

  def lease(self, actor_id):
    return self._call("lease", actor_id)

  def counts(self):
    return self._call("counts")

  def exhausted(self):
    return self._call("exhausted")

  def complete(self, actor_id, task_id):
    return self._call("complete", actor_id, task_id)

  def release(self, actor_id, task_id, max_releases=None):
    return self._call("release", actor_id, task_id, max_releases)


class RemoteQueue(_Remote):
  """GroupQueue.put through the hub; blocks while the learner's queue is full."""

  def put(self, group: Group) -> None:
    data = group.to_bytes()
    while not self._call("put", data):
      pass  # the hub already waited _PUT_WAIT_S: back-pressure


class RemoteRun(_Remote):
  """What an actor records about the run (infra counts), sent to the hub. Stands in for
  RunDirs where c2jax.rl.actors.infra expects one."""

  def record_infra(self, actor_id: str, **increments: int) -> dict[str, int]:
    return self._call("record_infra", actor_id, increments)


class RepoCache:
  """Task repositories fetched from the hub into this actor's scratch directory."""

  def __init__(self, ray, hub, actor_id: str):
    self._remote = _Remote(ray, hub)
    self.root = pathlib.Path(scratch.make(f"c2jax-{actor_id}-repos-"))
    self._fetched = 0

  def localize(self, payload: dict) -> dict:
    """The payload with its task's repository replaced by a local copy."""
    task = dict(payload["task"])
    target = self.root / f"{self._fetched:06d}"
    self._fetched += 1
    with tarfile.open(fileobj=io.BytesIO(self._remote._call("repo_archive", task["repo"])),
                      mode="r:gz") as tar:
      tar.extractall(target, filter="data")
    task["repo"] = str(target)
    return dict(payload, task=task)

  def forget(self, payload: dict) -> None:
    shutil.rmtree(payload["task"]["repo"], ignore_errors=True)

  def close(self) -> None:
    shutil.rmtree(self.root, ignore_errors=True)


# Seconds a process N > 0 of a multi-process actor waits for process 0 to name the
# coordinator (process 0's task may wait for a free CPU first).
COORDINATOR_WAIT_S = 600.0


def run_actor(hub, config_json: str, tokenizer, actor_id: str, weights_url: str,
              process: int = 0, incarnation: str = "") -> int:
  """The body of one Ray actor task: c2jax.rl.actors.actor.serve with the run reached through
  `hub` and weights read from `weights_url`. With config.actors.processes = N > 1 the actor
  is N such tasks (`process` 0..N-1, one `incarnation` per start): they form one
  jax.distributed job whose coordinator process 0 names through the hub; process 0 rolls
  out, the others follow its engine (each task in a Ray worker of its own, which exits
  with it: a jax.distributed job cannot be left and joined again in one process)."""
  import ray  # pylint: disable=g-import-not-at-top

  from c2jax.rl.actors import actor  # pylint: disable=g-import-not-at-top

  context = ray.get_runtime_context()
  address = ray.util.get_node_ip_address()
  ray.get(hub.placed.remote(actor_id if process == 0 else f"{actor_id}.p{process}",
                            context.get_task_id(), context.get_node_id(), address))
  cfg = ml_collections.ConfigDict(json.loads(config_json))
  if cfg.actors.processes > 1:
    _join(ray, hub, actor_id, incarnation, process, int(cfg.actors.processes), address)
  compile_cache.enable()
  repos = RepoCache(ray, hub, actor_id)
  try:
    return actor.serve(cfg, RemoteRun(ray, hub), RemotePool(ray, hub), RemoteQueue(ray, hub),
                       tokenizer, actor_id, weights_url, repos=repos)
  finally:
    repos.close()


def _join(ray, hub, actor_id: str, incarnation: str, process: int, count: int,
          address: str) -> None:
  """Joins the actor's jax.distributed job: process 0 picks a port on its node and names
  the coordinator through the hub; the others wait for that name."""
  from c2jax.parallel import distributed  # pylint: disable=g-import-not-at-top

  if process == 0:
    with socket.socket() as sock:
      sock.bind(("", 0))
      coordinator = f"{address}:{sock.getsockname()[1]}"
    ray.get(hub.set_coordinator.remote(actor_id, incarnation, coordinator))
  else:
    deadline = time.monotonic() + COORDINATOR_WAIT_S
    while (coordinator := ray.get(hub.coordinator.remote(actor_id, incarnation))) is None:
      if time.monotonic() > deadline:
        raise TimeoutError(f"{actor_id} process {process}: process 0 named no jax.distributed "
                           f"coordinator within {COORDINATOR_WAIT_S:.0f} s (is there a free "
                           "CPU for it in the Ray cluster?).")
      time.sleep(0.2)
  os.environ.update({distributed.ENV["coordinator_address"]: coordinator,
                     distributed.ENV["num_processes"]: str(count),
                     distributed.ENV["process_id"]: str(process)})
  distributed.initialize(distributed.distributed_defaults())
