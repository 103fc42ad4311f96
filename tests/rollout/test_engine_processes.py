"""One JaxEngine over several JAX processes (jax.distributed on loopback, 2 fake CPU
devices each): process 0 schedules, the others follow program by program
(c2jax.rollout.lockstep), and the tokens, log-probs and expert routing equal a one-device
engine's, through in-flight weight swaps, scoring and top log-probs; with expert
parallelism across the processes and tensor parallelism inside them; for 2 processes and
for 4. A follower stuck loading weights is named by the leader's hang watchdog
(lockstep.Watchdog)."""

import json
import pathlib
import subprocess
import sys

import pytest

from tests.rollout.test_engine_sharding import TOLERANCE
from tests.subprocess_checks import child_env

REPO = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).with_name("engine_processes_checks.py")
TIMEOUT_S = 420


def start(processes: int, mesh: dict, **env) -> list[subprocess.Popen]:
  from tests.parallel.test_distributed import _free_port  # pylint: disable=g-import-not-at-top

  port = _free_port()
  return [subprocess.Popen(
      [sys.executable, str(WORKER)], cwd=REPO, text=True, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=child_env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                    JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(rank),
                    ENGINE_MESH=json.dumps(mesh), **env))
          for rank in range(processes)]


def assert_same_as_one_device(result):
  assert result["tokens_equal"] and result["routing_equal"], result
  assert result["compared"] == 12 and result["logprob_err"] <= TOLERANCE, result
  assert result["versions_equal"] and result["before"] and result["after"], result


@pytest.mark.slow
def test_two_processes_expert_parallel_across_them_match_one_device_then_a_hang_is_named():
  """The checks, then a swap to version 3 whose weights the follower never finishes
  loading, so the leader waits inside installing them (placing arrays over both processes
  is a collective): after the hang timeout its watchdog names process 1 and what it is
  doing, and it exits 1; so does the follower (its own watchdog, or the job's
  coordination service once process 0 is gone)."""
  timeout_s = 8
  group = start(2, {"expert": 2, "tensor": 2}, ENGINE_HANG_AT="3",
                ENGINE_HANG_TIMEOUT_S=str(timeout_s))
  try:
    (out, err), _ = [p.communicate(timeout=TIMEOUT_S) for p in group]
  finally:
    for p in group:
      p.kill()
  assert group[0].returncode == 1 and group[1].returncode != 0, err[-3000:]
  leader = json.loads(out.strip().splitlines()[-1])
  assert (leader["processes"], leader["devices"]) == (2, 4)
  assert leader["mesh"] == {"expert": 2, "tensor": 2}
  assert_same_as_one_device(leader)
  assert_same_as_one_device(leader["second"])  # swapped back, as version 2
  assert leader["layouts"] == ["params=True,cache=True"]
  assert leader["score_err"] <= TOLERANCE and leader["top_ids_equal"]
  experts = leader["held"]["routed experts"]
  assert experts["bytes_per_device"] * 4 == experts["bytes"]
  # The hang: named by the leader's watchdog.
  [line] = [l for l in err.splitlines() if l.startswith("c2jax engine: ")]
  assert "installing weights version 3" in line and "on process 0" in line, line
  assert f"hang timeout {timeout_s} s" in line, line
  assert "waiting for process 1: process 1 (" in line, line
  assert "loading weights version 3" in line.split("waiting for process 1")[1], line


@pytest.mark.slow
def test_four_processes_expert_parallel_across_them_match_one_device():
  """Four processes of two devices: experts over all four (expert=4), tensor parallelism
  inside each (tensor=2); the first pass of requests through two in-flight swaps gives
  the one-device engine's tokens, routing and log-probs (the pass above, less the second
  pass and the hang, which two processes show)."""
  group = start(4, {"expert": 4, "tensor": 2}, ENGINE_ONE_PASS="1")
  try:
    outputs = [p.communicate(timeout=TIMEOUT_S) for p in group]
  finally:
    for p in group:
      p.kill()
  assert [p.returncode for p in group] == [0, 0, 0, 0], outputs[0][1][-3000:]
  leader = json.loads(outputs[0][0].strip().splitlines()[-1])
  assert (leader["processes"], leader["devices"]) == (4, 8)
  assert leader["mesh"] == {"expert": 4, "tensor": 2}
  assert_same_as_one_device(leader)


def test_the_watchdog_names_who_is_elsewhere():
  """Lockstep.Watchdog's diagnosis from the reports in the key-value store (a stand-in
  client; the two-process test above runs the real one)."""
  from c2jax.rollout import lockstep  # pylint: disable=g-import-not-at-top

  class Store:
    def __init__(self):
      self.kv = {}

    def key_value_set(self, key, value, allow_overwrite=False):
      assert allow_overwrite
      self.kv[key] = value

    def key_value_dir_get(self, prefix):
      return [(k, v) for k, v in self.kv.items() if k.startswith(prefix)]

  import time  # pylint: disable=g-import-not-at-top

  store, hangs = Store(), []
  dog = lockstep.Watchdog("t/e1", store, timeout_s=10.0, on_hang=hangs.append, poll_s=3600)
  dog._processes = 4  # pylint: disable=protected-access
  now = time.time()

  def report(rank, what, command, at=now):
    store.kv[f"t/e1/where/{rank:06d}"] = json.dumps(
        {"what": what, "command": command, "for_s": 12.0, "at": at,
         "host": "h", "pid": 100 + rank})

  report(1, "program 'decode'", 7)
  report(2, "loading weights version 3", 6)
  report(3, "program 'decode'", 7, at=now - 3600 * 4)  # its reports stopped long ago
  doing = ("program 'decode'", 7, time.monotonic() - 11, True, True)
  hang = dog._diagnose(doing)  # pylint: disable=protected-access
  assert hang.processes == [2, 3]
  assert "process 2 (h, pid 102): loading weights version 3 (command 6)" in str(hang)
  assert "process 3 (h, pid 103): silent for" in str(hang)
  report(2, "program 'decode'", 7)
  report(3, "program 'decode'", 7)
  hang = dog._diagnose(doing)  # pylint: disable=protected-access
  assert hang.processes == [0, 1, 2, 3] and "every process is inside it" in str(hang)
  alone = dog._diagnose(("loading weights version 3", 6, time.monotonic(), True, False))  # pylint: disable=protected-access
  assert alone.processes == [0] and "a step of this process alone" in str(alone)
  with pytest.raises(ValueError, match="hang_timeout_s"):
    lockstep.Watchdog("t/e2", store, timeout_s=0)
  dog.stop()


def test_an_engine_mesh_spreads_its_experts_across_processes():
  from c2jax.parallel import mesh  # pylint: disable=g-import-not-at-top
  from c2jax.rollout import sharding  # pylint: disable=g-import-not-at-top

  sizes = {"data": 1, "fsdp": 2, "expert": 8, "context": 1, "tensor": 4}
  spans = mesh.dcn_shape(sizes, 8, sharding.ENGINE_DCN_AXES)
  assert (spans["fsdp"], spans["expert"], spans["tensor"]) == (2, 4, 1)
  with pytest.raises(Exception, match="data-like ones; an engine's experts too"):
    mesh.dcn_shape(sizes, 32, sharding.ENGINE_DCN_AXES)  # tensor stays inside a host


def test_one_process_needs_no_lockstep_and_a_channel_needs_jax_distributed():
  from c2jax.rollout import lockstep  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  mesh = jax.make_mesh((1,), ("x",))
  assert not lockstep.spans_processes(mesh)
  with pytest.raises(RuntimeError, match="jax.distributed initialised"):
    lockstep.Lockstep()
