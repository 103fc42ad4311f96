"""The rollout engine across devices (c2jax.rollout.sharding): on 8 fake CPU devices the
sharded JaxEngine samples the same tokens with the same log-probs and expert routing as
one device, keeps its shardings through in-flight weight swaps (host arrays, or arrays
sharded another way), and speculative decoding works sharded; plus the config checks
that run before anything is placed."""

import json
import os
import pathlib
import subprocess
import sys

import ml_collections
import pytest

from c2jax import config as configlib
from c2jax import parallel
from c2jax.rl import job
from c2jax.rollout import sharding

REPO = pathlib.Path(__file__).resolve().parents[2]
CHECKS = pathlib.Path(__file__).with_name("engine_sharding_checks.py")
TOLERANCE = 1e-5  # float32 log-probs, one device vs a mesh


def run_checks(mode: str) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  result = subprocess.run([sys.executable, str(CHECKS), mode], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=1500)
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plain_results():
  return run_checks("plain")


@pytest.fixture(scope="module")
def speculative_results():
  return run_checks("speculative")


def assert_same_as_one_device(result):
  assert result["tokens_equal"], result
  assert result["compared"] == 12
  assert result["logprob_err"] <= TOLERANCE, result
  assert result["routing_equal"] and result["versions_equal"], result
  # The swap happened mid-generation: tokens of both versions were sampled.
  assert result["before"] and result["after"], result
  assert result["layouts"] == ["params=True,cache=True"], result


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["fsdp8", "data2_expert4"])
def test_sharded_engine_matches_one_device(plain_results, mesh):
  assert plain_results["devices"] == 8
  result = plain_results[mesh]
  assert_same_as_one_device(result)
  # Slots really are split over the data-like axes, and parameters really are sharded.
  assert result["cache_spec"] == "P(None, ('data', 'fsdp', 'expert'), None, None)"
  assert any("fsdp" in spec for spec in result["param_specs"])
  if "expert" in mesh:
    assert any("'expert'" in spec for spec in result["param_specs"])


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["fsdp8", "data2_expert4"])
def test_weight_swap_from_other_shardings_keeps_layout(plain_results, mesh):
  assert_same_as_one_device(plain_results[mesh]["second"])


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["fsdp8", "data2_expert4"])
def test_scoring_and_top_logprobs_sharded(plain_results, mesh):
  result = plain_results[mesh]
  assert result["score_err"] <= TOLERANCE
  assert result["top_ids_equal"] and result["top_err"] <= TOLERANCE


@pytest.mark.slow
def test_speculative_decoding_sharded(speculative_results):
  result = speculative_results["fsdp4_tensor2"]
  assert result["mesh"]["tensor"] == 2 and result["mesh"]["fsdp"] == 4
  assert_same_as_one_device(result)
  assert_same_as_one_device(result["second"])
  # Drafts were accepted (multi-token steps ran), as many as on one device.
  assert result["accepted"] == result["accepted_ref"] > 0


@pytest.mark.slow
def test_int4_experts_expert_parallel_match_one_device():
  """Routed experts held int4 (engine.weights_quant) under expert parallelism: the
  same tokens, log-probs and routing as one int4 engine, through swaps; each device holds
  a quarter of the experts' values and scales."""
  result = run_checks("int4")["data2_expert4"]
  assert_same_as_one_device(result)
  assert_same_as_one_device(result["second"])
  held = result["held"]["routed experts"]
  assert held["dtypes"] == ["float32", "int4"]
  assert held["bytes_per_device"] * 4 == held["bytes"]


# ---- config checks (one process, no compile) -------------------------------------------
def test_parse_mesh():
  cfg = sharding.parse_mesh("fsdp=4, tensor=2")
  assert dict(cfg.mesh) == {"data": 1, "fsdp": 4, "expert": 1, "context": 1, "tensor": 2}
  assert sharding.parse_mesh("expert=-1").mesh.expert == -1
  for bad in ("fsdb=4", "fsdp", "fsdp=x"):
    with pytest.raises(ValueError, match="axis=size"):
      sharding.parse_mesh(bad)


def test_check_config_errors_name_the_key():
  with pytest.raises(configlib.ConfigError, match=r"actors\.parallel\.mesh: splits the "
                     r"engine's slots 8 ways.*6 slots; use a multiple of 8"):
    sharding.check_config(sharding.parse_mesh("data=2,fsdp=4"), 6, "actors.parallel.")
  # Tensor parallelism leaves the slots whole: any count works.
  sharding.check_config(sharding.parse_mesh("tensor=8"), 3)
  with pytest.raises(configlib.ConfigError, match=r"parallel\.mesh\.context: is 2"):
    sharding.check_config(sharding.parse_mesh("context=2"), 8)
  with pytest.raises(configlib.ConfigError, match=r"actors\.parallel\.mesh\.fsdp: is 0"):
    sharding.check_config(sharding.parse_mesh("fsdp=0"), 8, "actors.parallel.")


def test_placement_on_one_device_is_no_mesh():
  assert sharding.placement_from_config(None, 4) is None
  assert sharding.placement_from_config(sharding.engine_parallel_defaults(), 4) is None
  assert sharding.placement_from_config(sharding.parse_mesh("fsdp=-1"), 4,
                                        devices=[object()]) is None


def test_placement_needs_enough_local_devices():
  with pytest.raises(configlib.ConfigError, match=r"asks for 8 devices.*this process has 1"):
    sharding.placement_from_config(sharding.parse_mesh("fsdp=8"), 8, devices=[object()])


def test_rl_job_validates_actor_mesh():
  cfg = job.job_defaults("tiny")
  assert dict(cfg.actors.parallel.mesh) == {axis: 1 for axis in cfg.actors.parallel.mesh}
  cfg.actors.slots = 6
  cfg.actors.parallel.mesh.fsdp = 4
  with pytest.raises(configlib.ConfigError, match=r"config\.actors\.parallel\.mesh: "):
    job.validate(cfg)


def test_actor_mesh_survives_the_run_config_round_trip():
  """Actors read the RL config back from the run's JSON (rules become lists): the
  section must still validate and give the same rules."""
  cfg = job.job_defaults("tiny")
  cfg.actors.parallel.mesh.update(data=2, tensor=2)
  back = ml_collections.ConfigDict(json.loads(cfg.to_json())).actors.parallel
  sharding.check_config(back, cfg.actors.slots, "actors.parallel.")
  assert parallel.rules_of(back) == parallel.rules_of(cfg.actors.parallel)
  assert dict(back.mesh) == dict(cfg.actors.parallel.mesh)
