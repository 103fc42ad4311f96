"""The persistent compilation cache across the processes of one CPU job (c2jax.compile_cache):
two jax.distributed processes of two devices each run one program over all four devices and
one program of their own. On an empty cache the first process compiles the shared program
and the second loads its binary; a second run loads both from the cache.

This file is also the worker: `python test_compile_cache.py` prints one JSON line.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from c2jax import compile_cache
from c2jax.parallel import distributed
from tests.subprocess_checks import REPO, child_env, json_result


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def _start_pair(cache_dir, **extra) -> list[subprocess.Popen]:
  port = _free_port()
  return [subprocess.Popen(
      [sys.executable, __file__],
      env=child_env(C2JAX_XLA_CACHE=cache_dir, C2JAX_XLA_CACHE_MIN_SECS=0,
                    XLA_FLAGS="--xla_force_host_platform_device_count=2",
                    JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=2,
                    JAX_PROCESS_ID=rank, **extra),
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for rank in range(2)]


def _run_pair(cache_dir) -> list[dict]:
  return [json_result(process, 300) for process in _start_pair(cache_dir)]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
  cache_dir = tmp_path_factory.mktemp("xla_cache")
  return _run_pair(cache_dir), _run_pair(cache_dir)


def test_every_process_gets_one_key_from_topologies_that_differ(two_runs):
  first, _ = two_runs
  assert first[0]["topology"] != first[1]["topology"]  # each names its own devices
  assert first[0]["key"] == first[1]["key"]
  # What stays in the key: the host's target machine and CPU features (the topology's
  # longest printable run).
  features = max(re.findall(rb"[ -~]+", bytes.fromhex(first[0]["topology"])), key=len)
  assert len(features) > 20 and features in bytes.fromhex(first[0]["key"])


def test_the_first_process_compiles_a_shared_program_and_hands_it_on(two_runs):
  first, _ = two_runs
  # Both sum the same global array; process 0 compiled the shared program (and its own
  # local one), process 1 only its own local one.
  assert first[0]["total"] == first[1]["total"] == sum(range(8))
  assert first[0]["compiled"] == ["local", "shared"] and first[0]["shared"] == ["shared"]
  assert first[1]["compiled"] == ["local"] and first[1]["received"] == ["shared"]
  assert first[0]["hits"] == first[1]["hits"] == 0


def test_a_second_run_loads_the_shared_program_on_every_process(two_runs):
  _, second = two_runs
  assert second[0]["total"] == second[1]["total"] == sum(range(8))
  # Process 0 wrote both its programs; process 1's own program is not written (JAX
  # writes from process 0 only), so process 1 compiles just that one again.
  assert second[0]["compiled"] == [] and second[0]["hits"] == 2
  assert second[1]["compiled"] == ["local"] and second[1]["hits"] == 1
  assert second[0]["shared"] == second[1]["received"] == []


def test_a_process_that_dies_ends_the_others_wait_with_an_error_naming_it(tmp_path):
  """Process 1 is killed before it looks the shared program up: process 0, waiting for
  it, stops waiting as soon as the peer watch finds it gone (not after JAX's 20 min)."""
  leader, follower = _start_pair(tmp_path, CHECK_DIE="1")
  follower.communicate(timeout=300)
  assert follower.returncode == -9
  result = json_result(leader, 300)
  assert result["error"] == ("RuntimeError: process 1 of this job stopped while the "
                             "processes were compiling 'jit__lambda' together")
  assert result["waited_s"] < 30


REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
HIT = "/jax/compilation_cache/cache_hits"


def _worker() -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax._src.lib import xla_client  # pylint: disable=g-import-not-at-top

  compile_cache.enable()
  distributed.initialize(distributed.distributed_defaults())
  events, phase = [], [""]
  jax.monitoring.register_event_listener(
      lambda event, **kw: events.append((phase[0], event)) if phase[0] else None)
  mesh = jax.make_mesh((4,), ("x",))
  sharding = jax.sharding.NamedSharding(mesh, jax.P("x"))
  values = jax.make_array_from_callback(
      (8,), sharding, lambda index: np.arange(8, dtype=np.float32)[index])
  phase[0] = "local"
  local = jax.jit(lambda x: x * 2 + 1)(np.ones(3, np.float32))
  if os.environ.get("CHECK_DIE") and jax.process_index() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
  phase[0] = "shared"
  started = time.monotonic()
  try:
    total = jax.jit(lambda x: x.sum(),
                    out_shardings=jax.sharding.NamedSharding(mesh, jax.P()))(values)
  except RuntimeError as error:
    print(json.dumps(dict(error=f"{type(error).__name__}: {error}",
                          waited_s=time.monotonic() - started)), flush=True)
    os._exit(0)  # pylint: disable=protected-access  (a peer is gone: no clean shutdown)
  phase[0] = ""
  topology = xla_client.get_topology_for_devices(jax.devices())
  print(json.dumps(dict(
      total=float(total.addressable_data(0)), local=float(local.sum()),
      compiled=[p for p in ("local", "shared") if (p, REQUEST) in events
                and not {(p, HIT), (p, compile_cache.RECEIVED_EVENT)} & set(events)],
      hits=events.count(("local", HIT)) + events.count(("shared", HIT)),
      received=[p for p, event in events if event == compile_cache.RECEIVED_EVENT],
      shared=[p for p, event in events if event == compile_cache.SHARED_EVENT],
      topology=topology.serialize().hex(),
      key=compile_cache.cpu_topology_key(topology.serialize()).hex())), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  _worker()
