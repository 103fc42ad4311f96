"""The RL learner on the shared training runtime, sharded as pretraining is: three RL
steps of the tiny MLA + MoE policy on 8 fake CPU devices with FSDP, data + FSDP + expert
and expert + context parallelism match one device; four jax.distributed processes on
loopback match one process (two run the whole `c2jax rl` in test_rl_processes.py). The
checks run in subprocesses (rl_sharded_checks.py)."""

import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from c2jax import config as configlib
from c2jax.rl import job
from tests.subprocess_checks import child_env, json_result

REPO = pathlib.Path(__file__).resolve().parents[2]
CHECKS = pathlib.Path(__file__).with_name("rl_sharded_checks.py")
TOLERANCE = 1e-5
TIMEOUT_S = 900


def _result(process: subprocess.Popen) -> dict:
  return json_result(process, TIMEOUT_S)


def _start(mode: str, **env) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, str(CHECKS), mode], cwd=REPO, env=child_env(**env),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def meshes():
  return _result(_start("meshes"))


@pytest.mark.slow  # one subprocess compiles the RL step for 1 device and 3 meshes
def test_the_policy_is_mla_with_moe_layers(meshes):
  assert meshes["one_device"]["attention"] == "mla"
  assert meshes["one_device"]["moe_layers"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fsdp8", "data2_fsdp2_expert2", "expert4_context2"])
def test_three_sharded_rl_steps_match_one_device(meshes, name):
  result, reference = meshes[name], meshes["one_device"]
  assert result["step"] == 3
  np.testing.assert_allclose(result["losses"], reference["losses"], atol=TOLERANCE,
                             rtol=0)
  assert result["param_diff"] <= TOLERANCE, result
  # The losses move: the steps really update the policy.
  assert len(set(reference["losses"])) == 3


@pytest.mark.slow
def test_the_meshes_really_shard(meshes):
  # FSDP over 8: a device holds about an eighth of the parameters and Adam moments (small
  # vectors whose length 8 does not divide stay whole).
  assert meshes["fsdp8"]["shard_fraction"] < 0.15
  assert meshes["data2_fsdp2_expert2"]["shard_fraction"] < 0.55
  assert meshes["fsdp8"]["batch_ways"] == 8
  for name in ("data2_fsdp2_expert2", "expert4_context2"):
    assert meshes[name]["all_to_all"], f"expert parallelism did not engage on {name}"
  assert meshes["expert4_context2"]["context_shards"] == 2
  assert meshes["expert4_context2"]["batch_ways"] == 4


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


@pytest.mark.slow  # 5 JAX processes each compile the tiny RL step
def test_four_learner_processes_of_two_devices_match_one_process():
  processes = 4
  port = _free_port()
  devices = 2 * processes
  pair = [_start("distributed", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                 JAX_NUM_PROCESSES=processes, JAX_PROCESS_ID=rank,
                 XLA_FLAGS="--xla_force_host_platform_device_count=2")
          for rank in range(processes)]
  single = _start("distributed",
                  XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  pair, single = [_result(p) for p in pair], _result(single)
  for rank, result in enumerate(pair):
    assert result["process"] == [rank, processes] and result["devices"] == [2, devices]
  assert single["process"] == [0, 1] and single["devices"] == [devices, devices]
  for result in pair:
    np.testing.assert_allclose(result["losses"], single["losses"], rtol=2e-5)
    np.testing.assert_allclose(result["param_sum"], single["param_sum"], rtol=2e-5)


def test_rl_config_has_the_pretraining_parallel_section():
  cfg = job.job_defaults("tiny")
  cfg.parallel.mesh.update({"fsdp": 1, "context": 2})
  cfg.actors.max_length = 1023
  with pytest.raises(configlib.ConfigError, match="actors.max_length"):
    job.validate(cfg, 2)
  cfg.actors.max_length = 1024
  cfg.parallel.context_load_balance = True
  with pytest.raises(configlib.ConfigError, match="context_load_balance"):
    job.validate(cfg, 2)
  cfg.parallel.context_load_balance = False
  job.validate(cfg, 2)
  cfg.parallel.mesh.fsdp = 3
  with pytest.raises(configlib.ConfigError, match="parallel.mesh"):
    job.validate(cfg, 2)
  cfg.parallel.mesh.fsdp = 1
  cfg.parallel.bogus = 1
  with pytest.raises(configlib.ConfigError, match="bogus"):
    job.validate(cfg, 2)
