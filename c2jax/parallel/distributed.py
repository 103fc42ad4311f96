"""Multi-process JAX: `jax.distributed.initialize` from config or environment.

    from c2jax.parallel import distributed
    distributed.initialize(cfg.parallel.distributed)   # before anything touches devices

A job runs one process per host (or per GPU). Each field of `parallel.distributed` left
at its default is read from the standard environment variables instead, so a launcher
(SLURM script, Kubernetes job) can set them per process without editing the config:
  coordinator_address  JAX_COORDINATOR_ADDRESS  host:port of process 0's coordinator
  num_processes        JAX_NUM_PROCESSES        processes in the job
  process_id           JAX_PROCESS_ID           this process's rank in [0, num_processes)
With no coordinator in either, JAX's own cluster detection (jax._src.clusters) is asked
next: a SLURM step (srun sets SLURM_JOB_ID, SLURM_NTASKS, SLURM_PROCID, ...), a Cloud TPU
VM pod slice or GKE TPU JobSet, Open MPI (mpirun) or a Kubernetes indexed Job; JAX then
initialises from what it detects (the coordinator is the first node; its port
$JAX_COORDINATOR_PORT or one derived from the job id). A cluster of one process, or no
cluster, is a single-process job and nothing is initialised. `auto = True` skips c2jax's
reading and calls jax.distributed.initialize() bare (e.g. for mpi4py, which JAX only uses
when asked). docs/cluster.md has a launch recipe for each.
CPU processes exchange collectives through gloo (jax_cpu_collectives_implementation),
each listening on the address through which it reaches the coordinator (JAX leaves gloo
to resolve the machine's hostname, which many hosts map to 127.0.0.1: the other hosts
could not connect).
After initialisation, `c2jax.parallel.make_mesh` builds a hybrid mesh whose data-like
axes span the processes.

A job whose host-side work happens once (the RL learner: actors, queue, weight
publishing) runs it on the leader, process 0, and shares results with two collectives
that every process calls at the same point (with one process both are free):
  batch = distributed.broadcast_arrays(batch if distributed.is_leader() else None)
  host = distributed.gather_for_leader(state.params)   # whole arrays on the leader
"""

from __future__ import annotations

import dataclasses
import functools
import io
import ipaddress
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from c2jax import compile_cache
from c2jax import config as configlib

ENV = {"coordinator_address": "JAX_COORDINATOR_ADDRESS",
       "num_processes": "JAX_NUM_PROCESSES", "process_id": "JAX_PROCESS_ID"}


def distributed_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.auto = False  # let jax.distributed.initialize() detect the cluster itself
  c.coordinator_address = ""  # "" -> $JAX_COORDINATOR_ADDRESS, else single-process
  c.num_processes = 0  # 0 -> $JAX_NUM_PROCESSES
  c.process_id = -1  # -1 -> $JAX_PROCESS_ID
  c.initialization_timeout_s = 300
  # JAX's coordination service ends every process this long after one stops answering
  # its heartbeats (JAX's default), without saying which; the peer watch below speaks
  # first.
  c.heartbeat_timeout_s = 100
  # Each process probes every other's address; one that does not answer for this long
  # (a host that died or dropped off the network) is named, and this process stops with
  # status PEER_LOST_EXIT so the job can be resumed from its last checkpoint. 0: off.
  c.peer_timeout_s = 60
  return c


def validate(dist_cfg) -> None:
  configlib.check_keys(dist_cfg, distributed_defaults(), "parallel.distributed.")
  if dist_cfg.num_processes < 0:
    raise configlib.ConfigError("parallel.distributed.num_processes",
                                f"is {dist_cfg.num_processes}; use >= 1, or 0 for the env.")
  if dist_cfg.process_id < -1:
    raise configlib.ConfigError("parallel.distributed.process_id",
                                f"is {dist_cfg.process_id}; use >= 0, or -1 for the env.")
  if dist_cfg.initialization_timeout_s <= 0:
    raise configlib.ConfigError("parallel.distributed.initialization_timeout_s",
                                "must be positive (seconds to wait for every process).")
  if dist_cfg.heartbeat_timeout_s <= 0:
    raise configlib.ConfigError("parallel.distributed.heartbeat_timeout_s",
                                "must be positive (seconds without a heartbeat).")
  if dist_cfg.peer_timeout_s < 0:
    raise configlib.ConfigError("parallel.distributed.peer_timeout_s",
                                "must be >= 0 (seconds a peer may not answer; 0: off).")


@dataclasses.dataclass(frozen=True)
class Settings:
  coordinator_address: str
  num_processes: int
  process_id: int
  initialization_timeout_s: int
  cluster: str = ""  # the cluster JAX detected ('slurm', 'gketpu', ...); '' = config / env
  heartbeat_timeout_s: int = 100
  peer_timeout_s: float = 60.0


def detect_cluster(environ=None):
  """The cluster environment JAX's own detection finds (a jax._src.clusters.ClusterEnv
  subclass), or None. JAX's detectors read os.environ, so a custom `environ` (tests of
  the JAX_* path) detects nothing."""
  if environ is not None and environ is not os.environ:
    return None
  from jax._src import clusters  # pylint: disable=g-import-not-at-top  # JAX's detectors
  return next((env for env in clusters.ClusterEnv._cluster_types  # pylint: disable=protected-access
               if not env.opt_in_only_method and env.is_env_present()), None)


def _cluster_settings(timeout_s: int, environ) -> Settings | None:
  env = detect_cluster(environ)
  if env is None or env.get_process_count() <= 1:
    return None
  address = env.get_coordinator_address(
      timeout_secs=timeout_s, override_coordinator_port=os.environ.get("JAX_COORDINATOR_PORT"))
  return Settings(address, env.get_process_count(), env.get_process_id(), timeout_s,
                  cluster=env.name or env.__name__)


def resolve(dist_cfg, environ=None) -> Settings | None:
  """The initialize() arguments from config, then the JAX_* environment, then the cluster
  JAX detects; None = single process."""
  environ = os.environ if environ is None else environ

  def field(name, unset):
    value = dist_cfg[name]
    if value != unset:
      return value, f"config.parallel.distributed.{name}"
    if environ.get(ENV[name], "") != "":
      return environ[ENV[name]], f"${ENV[name]}"
    return None, f"config.parallel.distributed.{name} or ${ENV[name]}"

  address, _ = field("coordinator_address", "")
  if address is None:
    return _cluster_settings(int(dist_cfg.initialization_timeout_s), environ)
  values = {}
  for name, unset in (("num_processes", 0), ("process_id", -1)):
    value, source = field(name, unset)
    if value is None:
      raise configlib.ConfigError(
          f"parallel.distributed.{name}",
          f"is unset but a coordinator ({address}) is; set {source} for every process.")
    try:
      values[name] = int(value)
    except ValueError:
      raise configlib.ConfigError(f"parallel.distributed.{name}",
                                  f"{source} = {value!r} is not an integer.") from None
  if not 0 <= values["process_id"] < values["num_processes"]:
    raise configlib.ConfigError(
        "parallel.distributed.process_id",
        f"= {values['process_id']} is outside [0, {values['num_processes']}).")
  return Settings(str(address), values["num_processes"], values["process_id"],
                  int(dist_cfg.initialization_timeout_s))


def _with_timeouts(settings: Settings | None, dist_cfg) -> Settings | None:
  if settings is None:
    return None
  return dataclasses.replace(settings, heartbeat_timeout_s=int(dist_cfg.heartbeat_timeout_s),
                             peer_timeout_s=float(dist_cfg.peer_timeout_s))


def initialize(dist_cfg, environ=None) -> bool:
  """Joins the job's processes; True if this is a multi-process run.

  Must run before the first use of jax.devices(). Calling it again is a no-op.
  """
  if jax.distributed.is_initialized():
    return True
  if dist_cfg.auto:
    jax.distributed.initialize(initialization_timeout=int(dist_cfg.initialization_timeout_s))
    return True
  settings = _with_timeouts(resolve(dist_cfg, environ), dist_cfg)
  if settings is None:
    return False
  print(f"distributed: process {settings.process_id} of {settings.num_processes}, "
        f"coordinator {settings.coordinator_address}"
        + (f" ({settings.cluster} detected)" if settings.cluster else ""), flush=True)
  timeouts = dict(initialization_timeout=settings.initialization_timeout_s,
                  heartbeat_timeout_seconds=settings.heartbeat_timeout_s)
  if settings.cluster:  # JAX initialises from its own detection (local devices included)
    jax.distributed.initialize(**timeouts)
  else:
    jax.distributed.initialize(
        coordinator_address=settings.coordinator_address,
        num_processes=settings.num_processes, process_id=settings.process_id, **timeouts)
  _pin_gloo_address()
  if settings.peer_timeout_s > 0:
    PeerWatch.start(settings)
    # Processes that look a program up together stop waiting for one that is gone.
    compile_cache.watch_peers(unreachable_peers)
  return True


# A process that lost a peer stops with this status (EX_TEMPFAIL): resume the job from its
# last checkpoint (a scheduler's requeue-on-failure, or rerunning the command).
PEER_LOST_EXIT = 75


class PeerWatch:
  """Each process of a multi-process job listens on the address that reaches the
  coordinator and probes every other process's, every few seconds. A peer that has not
  answered for `peer_timeout_s` (its host died, or lost its network: its process may still
  be running, unreachable) is named, with its address, and this process stops with status
  PEER_LOST_EXIT. A lost peer's collectives never complete, so no process can checkpoint
  the step in flight: the job resumes from its last checkpoint (what `resume_hint` says,
  registered by the run). Without this, JAX's coordination service ends every process
  `heartbeat_timeout_s` after, naming no host."""

  resume_hint: Callable[[], str] | None = None  # set by the train / RL loops
  current: "PeerWatch | None" = None  # the process's running watch (stop_peer_watch)

  def __init__(self, settings: Settings, peers: dict[int, tuple[str, int]]):
    self.settings, self.peers = settings, peers
    self.period_s = max(0.5, min(5.0, settings.peer_timeout_s / 4))
    self.stopped = threading.Event()  # stop_peer_watch: the run's collectives are over

  @classmethod
  def start(cls, settings: Settings) -> "PeerWatch":
    from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
    client = jax_distributed.global_state.client
    address = local_address_towards(settings.coordinator_address)
    server = socket.create_server((address, 0))
    threading.Thread(target=_answer, args=(server,), name="peer-watch-listener",
                     daemon=True).start()
    host = f"[{address}]" if ":" in address else address
    client.key_value_set(f"c2jax/peer/{settings.process_id}",
                         f"{host}:{server.getsockname()[1]}")
    peers = {}
    for rank in range(settings.num_processes):
      if rank != settings.process_id:
        value = client.blocking_key_value_get(f"c2jax/peer/{rank}",
                                              settings.initialization_timeout_s * 1000)
        peer_host, _, port = value.rpartition(":")
        peers[rank] = (peer_host.strip("[]"), int(port))
    watch = cls(settings, peers)
    PeerWatch.current = watch
    threading.Thread(target=watch.run, name="peer-watch", daemon=True).start()
    return watch

  def answering(self, rank: int) -> bool:
    try:
      socket.create_connection(self.peers[rank], timeout=min(2.0, self.period_s)).close()
      return True
    except OSError:
      return False

  def run(self, clock=time.monotonic, exit_fn=os._exit) -> None:  # pylint: disable=protected-access
    last_answer = {rank: clock() for rank in self.peers}
    while not self.stopped.is_set():
      now = clock()
      for rank in self.peers:
        if self.answering(rank):
          last_answer[rank] = now
      lost = [rank for rank, when in last_answer.items()
              if now - when > self.settings.peer_timeout_s]
      if lost:
        names = ", ".join(f"process {rank} at {self.peers[rank][0]}" for rank in lost)
        hint = PeerWatch.resume_hint() if PeerWatch.resume_hint else ""
        print(f"distributed: lost {names}: no answer for {self.settings.peer_timeout_s:.0f} s"
              f" (parallel.distributed.peer_timeout_s); process {self.settings.process_id} "
              f"stops with status {PEER_LOST_EXIT}. {hint}".rstrip(), flush=True)
        sys.stderr.flush()
        exit_fn(PEER_LOST_EXIT)
        return
      self.stopped.wait(self.period_s)


def stop_peer_watch() -> None:
  """Called by a run when its last collective is behind it (the step loop returned): from
  then on the processes finish at their own pace (the leader's closing work may outlast
  the others' exit), which is no lost peer."""
  if PeerWatch.current is not None:
    PeerWatch.current.stopped.set()


def _answer(server: socket.socket) -> None:
  """Accepts the peers' probes (and closes them: the connection is the answer)."""
  while True:
    try:
      connection, _ = server.accept()
    except OSError:
      return
    connection.close()


def unreachable_peers() -> list[int]:
  """The processes whose peer-watch address does not answer right now (each probed once,
  2 s at most): what a failed collective is most likely waiting for. [] without a
  running peer watch."""
  watch = PeerWatch.current
  if watch is None:
    return []
  return [rank for rank in sorted(watch.peers) if not watch.answering(rank)]


def local_address_towards(coordinator_address: str) -> str:
  """This host's address on the route to `coordinator_address` (host:port): the source
  address the kernel picks for it (a UDP connect sends nothing)."""
  host, _, port = coordinator_address.rpartition(":")
  family, _, _, _, target = socket.getaddrinfo(host.strip("[]"), int(port),
                                               type=socket.SOCK_DGRAM)[0]
  with socket.socket(family, socket.SOCK_DGRAM) as probe:
    probe.connect(target)
    return probe.getsockname()[0]


def _pin_gloo_address() -> None:
  """CPU collectives (gloo) on the address that reaches the coordinator, when that is not
  a loopback address. JAX creates gloo without an address, and gloo then resolves the
  hostname, which many machines map to 127.0.0.1 (/etc/hosts): it would listen where no
  other host reaches it. Runs before the CPU backend exists (initialize's contract)."""
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top

  state = jax_distributed.global_state
  if (jax.config.jax_cpu_collectives_implementation != "gloo" or state.client is None
      or not state.coordinator_address):
    return
  address = local_address_towards(state.coordinator_address)
  if ipaddress.ip_address(address).is_loopback:
    return  # every process on this machine: the default reaches them all
  collectives = _jax.make_gloo_tcp_collectives(distributed_client=state.client,
                                               hostname=address)
  xla_bridge.register_backend_factory(
      "cpu", functools.partial(xla_bridge.make_cpu_client, collectives=collectives),
      priority=0, fail_quietly=False)


def is_leader() -> bool:
  """Whether this is process 0, which does a multi-process job's host-side work."""
  return jax.process_index() == 0


_STOP = -1  # the size broadcast when the leader has nothing more to send
_MIN_BUCKET = 1 << 12


def any_process(flag: bool) -> bool:
  """Whether `flag` is true on any process (e.g. "my shard still has data"). Every process
  must call this at the same point; with one process it is `flag`."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.any(multihost_utils.process_allgather(np.int32(bool(flag)))))


def broadcast_arrays(arrays: dict | None) -> dict | None:
  """The leader's dict of host arrays (name -> numpy array) on every process; what the
  others pass is ignored. A leader passing None (it is stopping) makes every process
  return None. Every process must call this at the same point; with one process the
  dict is returned as is.

  The arrays travel as one serialised buffer, padded to a power of two so that batches
  of slowly changing shapes reuse a few compiled broadcasts."""
  if jax.process_count() == 1:
    return arrays
  payload = b""
  if is_leader() and arrays is not None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    payload = buffer.getvalue()
  size = len(payload) if is_leader() and arrays is not None else _STOP
  size = int(multihost_utils.broadcast_one_to_all(np.int32(size)))
  if size == _STOP:
    return None
  bucket = max(_MIN_BUCKET, 1 << (size - 1).bit_length())
  data = np.zeros(bucket, np.uint8)
  if is_leader():
    data[:size] = np.frombuffer(payload, np.uint8)
  data = np.asarray(multihost_utils.broadcast_one_to_all(data))
  with np.load(io.BytesIO(data[:size].tobytes())) as loaded:
    return {name: loaded[name] for name in loaded.files}


@functools.lru_cache(maxsize=8)
def _replicate(mesh):
  return jax.jit(lambda tree: tree,
                 out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def gather_for_leader(tree):
  """`tree` (global arrays on one mesh) in a form the leader can read whole: with one
  process the tree itself (np.asarray reads any leaf); with several, host numpy arrays on
  the leader and None on the others. A collective: every process must call it. The
  arrays are replicated over the mesh for the copy, so each device briefly holds them
  all."""
  if jax.process_count() == 1:
    return tree
  leaves = jax.tree.leaves(tree)
  if not leaves:
    return tree if is_leader() else None
  whole = _replicate(leaves[0].sharding.mesh)(tree)
  if not is_leader():
    return None
  return jax.tree.map(lambda leaf: np.asarray(leaf.addressable_data(0)), whole)
