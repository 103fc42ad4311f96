"""The persistent XLA compilation cache every c2jax process shares.

A resumed job, the next phase of a pipeline, and every actor process of an RL run compile
the same programs; with the cache on, each is compiled once per machine and loaded from
disk after that. `c2jax.cli` turns it on for every verb; processes that start without the
cli (RL actors, test subprocesses) call `enable()` themselves.

    C2JAX_XLA_CACHE=DIR             where (default ~/.cache/c2jax/xla); `off` disables it
    C2JAX_XLA_CACHE_MIN_SECS=SECS   skip programs that compile faster (default 1); the
                                    test suite sets 0, its processes compile the same small
                                    programs many times over

A job of several processes on CPU (`jax.distributed`: the CPU meshes of tests and
laptops, a multi-process RL actor) needs two things JAX does not give it, and `enable()`
adds them (`_share_across_processes`):
- One key on every process. JAX keys a program by the topology of the calling process's
  own devices, whose serialised form on CPU names that process's index: process 1 never
  found what process 0 wrote. The key here hashes that topology with the device list left
  out (the host's target machine and CPU features stay in it).
- Lockstep. Processes that run one program look it up together and agree: all load it, or
  none does and the first process compiles it and hands the binary to the others through
  the job's key-value store (as JAX's `jax_share_binary_between_hosts` does on a miss).
  Without that, process 0 loading while process 1 compiled missed Gloo's 30 s rendezvous
  at the first collective on a loaded machine, and every process compiled each program.
  A process that stops meanwhile ends the others' wait with an error naming it, once
  `watch_peers` knows how to find it (c2jax.parallel.distributed's peer watch).
"""

import collections
import os
import threading
import time
import warnings
from collections.abc import Callable

DEFAULT_DIR = "~/.cache/c2jax/xla"


def enable() -> None:
  location = os.environ.get("C2JAX_XLA_CACHE", DEFAULT_DIR)
  if location.lower() in ("off", "0", "none", ""):
    return
  import jax  # pylint: disable=g-import-not-at-top  (keeps this module free of jax)

  raw = os.environ.get("C2JAX_XLA_CACHE_MIN_SECS", "1")
  try:
    min_secs = float(raw)
  except ValueError:
    raise ValueError(f"C2JAX_XLA_CACHE_MIN_SECS={raw!r} is not a number of seconds; set "
                     "e.g. 1 (the default), or 0 to cache every program.") from None
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(location))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", min_secs)
  _share_across_processes(jax)


def _varint(buf: bytes, at: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    byte = buf[at]
    at += 1
    value |= (byte & 0x7F) << shift
    shift += 7
    if not byte & 0x80:
      return value, at


def _proto_fields(buf: bytes) -> list[tuple[int, int, object]]:
  """(field number, wire type, value) of one serialised protocol buffer message."""
  fields, at = [], 0
  while at < len(buf):
    key, at = _varint(buf, at)
    wire = key & 7
    if wire == 0:
      value, at = _varint(buf, at)
    elif wire == 2:
      size, at = _varint(buf, at)
      value, at = buf[at:at + size], at + size
    elif wire in (1, 5):
      width = 8 if wire == 1 else 4
      value, at = buf[at:at + width], at + width
    else:
      raise ValueError(f"wire type {wire} in a topology description")
    fields.append((key >> 3, wire, value))
  return fields


_CPU_TOPOLOGY = b"type.googleapis.com/xla.CpuTopologyProto"


def cpu_topology_key(serialized: bytes) -> bytes:
  """A CPU topology description (PjRtTopologyDescriptionProto, serialised) without its
  device list: every process of a job gets the same bytes, which still name the host's
  target machine and CPU features (xla.CpuTopologyProto: devices are field 1)."""
  parts = []
  for number, wire, value in _proto_fields(serialized):
    if wire == 2 and value.startswith(b"\n") and _CPU_TOPOLOGY in value[:64]:
      inner = dict((n, v) for n, _, v in _proto_fields(value))
      if inner.get(1) == _CPU_TOPOLOGY:
        value = repr([f for f in _proto_fields(inner.get(2, b"")) if f[0] != 1]).encode()
    parts.append(repr((number, wire, value)).encode())
  return b"|".join(parts)


# jax.monitoring events: a process compiled a program for the others / loaded one from them.
SHARED_EVENT = "/c2jax/compilation_cache/binary_shared"
RECEIVED_EVENT = "/c2jax/compilation_cache/binary_received"
_SHARING = threading.Lock()
_reads: collections.Counter = collections.Counter()


# Which processes of the job no longer answer (c2jax.parallel.distributed's peer watch
# registers it through watch_peers); None: a wait ends only at JAX's sharing timeout.
_lost_peers: Callable[[], list[int]] | None = None


def watch_peers(lost: Callable[[], list[int]]) -> None:
  """`lost()` names the processes of the job that no longer answer: a process waiting for
  them to look up or compile a program stops waiting with an error (the job's collectives
  would fail on them next)."""
  global _lost_peers
  _lost_peers = lost


def _wait_for(client, key: str, processes: list[int], module_name: str, *,
              as_bytes: bool = False):
  """The value another process of the job sets under `key`, waited for in 1 s slices: a
  process that stopped (watch_peers) ends the wait with an error rather than after JAX's
  20-minute sharing timeout. (JAX's own get_live_nodes is no help: it waits for every
  live process to ask too.)"""
  import jax  # pylint: disable=g-import-not-at-top

  get = client.blocking_key_value_get_bytes if as_bytes else client.blocking_key_value_get
  deadline = time.monotonic() + jax.config.jax_share_binary_between_hosts_timeout_ms / 1000
  while True:
    try:
      return get(key, 1000)
    except Exception as error:  # pylint: disable=broad-exception-caught
      if "DEADLINE_EXCEEDED" not in str(error):
        raise
    gone = [rank for rank in (_lost_peers() if _lost_peers else []) if rank in processes]
    if gone:
      raise RuntimeError(
          f"process{'es' if len(gone) > 1 else ''} {', '.join(map(str, gone))} of this job "
          f"stopped while the processes were compiling {module_name!r} together")
    if time.monotonic() > deadline:
      raise TimeoutError(
          f"waited jax_share_binary_between_hosts_timeout_ms for the other processes of "
          f"this job to look up or compile {module_name!r}: raise that JAX option if a "
          "compile takes longer, or set C2JAX_XLA_CACHE=off (each process then compiles "
          "on its own)")


def _share_across_processes(jax) -> None:
  """One key, lockstep lookups and one compile per job for the programs a CPU job of
  several processes runs together (the module docstring says why). Programs of one
  process, and every program on TPU and GPU, keep JAX's own behaviour."""
  from jax._src import cache_key, compilation_cache, compiler, distributed  # pylint: disable=g-import-not-at-top
  from jax._src.lib import xla_client  # pylint: disable=g-import-not-at-top

  if getattr(compiler, "_c2jax_shared", False):
    return
  if not (hasattr(cache_key, "_hash_accelerator_config") and hasattr(compiler, "_cache_read")
          and hasattr(compiler, "_compile_and_write_cache")):  # JAX's internals moved
    warnings.warn(f"c2jax.compile_cache: JAX {jax.__version__} lacks the internals this "
                  "module wraps; the processes of a CPU job will not share compiled programs "
                  "(setup.py pins the JAX versions it knows).")
    return
  hash_accelerator_config = cache_key._hash_accelerator_config
  cache_read, compile_and_write = compiler._cache_read, compiler._compile_and_write_cache

  def processes_on_cpu(devices) -> list[int]:
    """The processes that run a program together, or [] for one process / not CPU."""
    devices = list(devices)
    if distributed.global_state.client is None or not devices or devices[0].platform != "cpu":
      return []
    processes = sorted({d.process_index for d in devices})
    return processes if len(processes) > 1 else []

  def hash_config(hash_obj, accelerators):
    devices = list(accelerators.flat)
    if not processes_on_cpu(devices):
      return hash_accelerator_config(hash_obj, accelerators)
    topology = xla_client.get_topology_for_devices(devices)
    hash_obj.update(cpu_topology_key(topology.serialize()))

  def read(module_name, key, compile_options, backend, executable_devices, host_callbacks):
    executable, compile_time = cache_read(module_name, key, compile_options, backend,
                                          executable_devices, host_callbacks)
    processes = processes_on_cpu(executable_devices)
    if not processes:
      return executable, compile_time
    client, me = distributed.global_state.client, distributed.global_state.process_id
    with _SHARING:  # the processes look their programs up in one order: the nth lookup of
      _reads[key] += 1  # a key on one process meets the nth on the others
      prefix = f"c2jax_compile_cache/{key}/{_reads[key]}"
    client.key_value_set(f"{prefix}/{me}", "1" if executable is not None else "0")
    found = [_wait_for(client, f"{prefix}/{p}", processes, module_name) == "1"
             for p in processes if p != me]
    if executable is not None and all(found):
      return executable, compile_time
    return None, None  # one of them compiles it: compile() below

  def compile_(backend, computation, executable_devices, compile_options, host_callbacks,
               module_name, key):
    processes = processes_on_cpu(executable_devices)
    if not processes:
      return compile_and_write(backend, computation, executable_devices, compile_options,
                               host_callbacks, module_name, key)
    client, me = distributed.global_state.client, distributed.global_state.process_id
    with _SHARING:
      binary = f"c2jax_compile_cache/{key}/{_reads[key]}/binary"
    if me == processes[0]:  # compiles, writes the cache, hands the binary on
      executable = compile_and_write(backend, computation, executable_devices,
                                     compile_options, host_callbacks, module_name, key)
      client.key_value_set_bytes(binary, compilation_cache.compress_executable(
          backend.serialize_executable(executable)))
      jax.monitoring.record_event(SHARED_EVENT)
      return executable
    serialized = _wait_for(client, binary, processes, module_name, as_bytes=True)
    jax.monitoring.record_event(RECEIVED_EVENT)
    return backend.deserialize_executable(compilation_cache.decompress_executable(serialized),
                                          executable_devices, compile_options, host_callbacks)

  cache_key._hash_accelerator_config = hash_config
  compiler._cache_read = read
  compiler._compile_and_write_cache = compile_
  compiler._c2jax_shared = True
