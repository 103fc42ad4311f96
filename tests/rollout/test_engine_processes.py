"""One JaxEngine over several JAX processes (jax.distributed on loopback, 2 fake CPU
devices each): process 0 schedules, the others follow program by program
(c2jax.rollout.lockstep), and the tokens, log-probs and expert routing equal a one-device
engine's, through in-flight weight swaps, scoring and top log-probs; with expert
parallelism across the processes and tensor parallelism inside them."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.rollout.test_engine_sharding import TOLERANCE
from tests.subprocess_checks import child_env, json_result

REPO = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).with_name("engine_processes_checks.py")
TIMEOUT_S = 420


def launch(processes: int, mesh: dict, weights_quant: str = "none") -> list[dict]:
  from tests.parallel.test_distributed import _free_port  # pylint: disable=g-import-not-at-top

  port = _free_port()
  group = [subprocess.Popen(
      [sys.executable, str(WORKER)], cwd=REPO, text=True, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      # No compilation cache: JAX writes it from process 0 only, and a process that
      # compiles while the others load waits past Gloo's rendezvous (as test_distributed).
      env=child_env(C2JAX_XLA_CACHE="off", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                    JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(rank),
                    ENGINE_MESH=json.dumps(mesh), ENGINE_WEIGHTS_QUANT=weights_quant))
           for rank in range(processes)]
  return [json_result(p, TIMEOUT_S) for p in group]


def assert_same_as_one_device(result):
  assert result["tokens_equal"] and result["routing_equal"], result
  assert result["compared"] == 12 and result["logprob_err"] <= TOLERANCE, result
  assert result["versions_equal"] and result["before"] and result["after"], result


@pytest.mark.slow
def test_two_processes_expert_parallel_across_them_match_one_device():
  leader, follower = launch(2, {"expert": 2, "tensor": 2})
  assert (leader["processes"], leader["devices"]) == (2, 4)
  assert leader["mesh"] == {"expert": 2, "tensor": 2}
  assert_same_as_one_device(leader)
  assert_same_as_one_device(leader["second"])  # swapped back, as version 2
  assert leader["layouts"] == ["params=True,cache=True"]
  assert leader["score_err"] <= TOLERANCE and leader["top_ids_equal"]
  # The follower ran every program and installed both swaps.
  assert follower == {"process": 1, "followed": 2}
  experts = leader["held"]["routed experts"]
  assert experts["bytes_per_device"] * 4 == experts["bytes"]


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
