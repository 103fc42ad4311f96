"""Expert parallelism (c2jax.parallel.expert): all-to-all dispatch against the dense
reference on 8 fake CPU devices, fixed and ragged exchanges, capacity drops, MXFP8
dispatch, the MoE layer with router replay, and real train steps on several meshes
against one device."""

import json
import os
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import config as configlib
from c2jax import parallel
from c2jax.model import config as model_config
from c2jax.model import moe, variants
from c2jax.parallel import expert

REPO = pathlib.Path(__file__).resolve().parents[2]
CHECKS = pathlib.Path(__file__).with_name("expert_parallel_checks.py")
TOLERANCE = 1e-5  # float32, forward and gradient


def run_checks(name: str) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  result = subprocess.run([sys.executable, str(CHECKS), name], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=1200)
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def dispatch_results():
  return run_checks("dispatch")


@pytest.mark.parametrize("case", ["expert4", "data2_fsdp2_expert2",
                                  "data2_fsdp2_expert2_entry_gather", "expert4_mxfp8"])
def test_no_drop_dispatch_matches_dense_reference(dispatch_results, case):
  result = dispatch_results[case]
  assert result["all_to_all"], "expert parallelism did not engage on this mesh"
  assert result["expert_axes"] == ["expert"]
  assert "expert" in result["token_axes"]
  assert result["dropped"] == 0 and result["dropped_ref"] == 0
  # Experts 3 and 6 receive no tokens: their shards run empty groups.
  assert result["y_err"] <= TOLERANCE, result
  assert result["grad_err"] <= TOLERANCE, result


@pytest.mark.parametrize("case", ["expert4_ragged", "expert4_ragged_uneven",
                                  "data2_fsdp2_expert2_ragged", "expert4_ragged_mxfp8"])
def test_ragged_exchange_matches_dense_reference(dispatch_results, case):
  """Dropless EP that sends only the copies each shard has for another (on the CPU the
  ragged all-to-all runs as its all-gather emulation): exact forward and gradient,
  13 tokens included (padded rows are not sent); MXFP8 against fake-quantised tokens."""
  result = dispatch_results[case]
  # The emulation's all-gathers, and none of the fixed buckets' all-to-alls.
  assert result["all_gather"] and not result["all_to_all"]
  assert result["expert_axes"] == ["expert"]
  assert result["dropped"] == 0 and result["dropped_ref"] == 0
  assert result["y_err"] <= TOLERANCE, result
  assert result["grad_err"] <= TOLERANCE, result
  if case.endswith("mxfp8"):
    fixed = dispatch_results["expert4_mxfp8"]
    assert result["diff_from_plain"] == pytest.approx(fixed["diff_from_plain"], rel=1e-5)


def test_emulated_ragged_all_to_all_follows_the_jax_docstring_example(dispatch_results):
  # lax.ragged_all_to_all's docstring: results [1, 3, 0, 0] and [2, 2, 4, 0].
  assert dispatch_results["emulated_ragged_example"] == [[1, 3, 0, 0], [2, 2, 4, 0]]


@pytest.mark.parametrize("exchange,factor,platform,expected", [
    ("auto", 0.0, "tpu", "ragged"), ("auto", 0.0, "gpu", "ragged"),
    ("auto", 0.0, "cpu", "fixed"),  # XLA:CPU has no ragged all-to-all
    ("auto", 1.25, "tpu", "fixed"),  # a capacity bounds the buckets: fixed shapes
    ("fixed", 0.0, "tpu", "fixed"), ("ragged", 0.0, "cpu", "ragged")])
def test_exchange_resolution(exchange, factor, platform, expected):
  assert expert.resolve_exchange(exchange, factor, platform) == expected


def test_ragged_exchange_with_a_capacity_is_refused():
  with pytest.raises(ValueError, match="ep_capacity_factor = 1.25"):
    expert.resolve_exchange("ragged", 1.25, "tpu")
  cfg = variants.get("tiny")
  cfg.moe.update(ep_exchange="ragged", ep_capacity_factor=1.25)
  with pytest.raises(configlib.ConfigError, match="moe.ep_exchange"):
    model_config.validate(cfg)


def test_fsdp_split_expert_weights_are_gathered_inside_and_their_gradient_reduce_scattered(
    dispatch_results):
  """Experts split over fsdp (embed dim) as the rules store them: gathered inside the
  shard_map, their gradient leaves by reduce-scatter, and the all-reduce left is the data
  axis' sum of those shards (half the volume of summing whole weights over data x fsdp)."""
  inside = dispatch_results["data2_fsdp2_expert2"]["collectives"]
  entry = dispatch_results["data2_fsdp2_expert2_entry_gather"]["collectives"]
  local_expert_bytes = dispatch_results["data2_fsdp2_expert2"]["local_expert_bytes"]
  assert entry["reduce-scatter"] == 0
  assert entry["all-reduce"] >= local_expert_bytes
  assert inside["reduce-scatter"] >= local_expert_bytes
  assert inside["all-reduce"] < entry["all-reduce"] - local_expert_bytes / 4


def test_token_local_dispatch_gathers_fsdp_split_experts_inside(dispatch_results):
  """The Pallas path without EP (token_local_forward): exact against the dense
  reference, and its expert gradient reduce-scattered over fsdp rather than all-reduced
  whole over data x fsdp."""
  inside = dispatch_results["token_local_data2_fsdp4"]
  entry = dispatch_results["token_local_data2_fsdp4_entry_gather"]
  all_expert_bytes = inside["expert_bytes"]
  for result in (inside, entry):
    assert result["token_axes"] == ["data", "fsdp"]
    assert result["y_err"] <= TOLERANCE and result["grad_err"] <= TOLERANCE, result
  assert entry["collectives"]["all-reduce"] >= all_expert_bytes
  assert inside["collectives"]["reduce-scatter"] >= all_expert_bytes
  assert inside["collectives"]["all-reduce"] < all_expert_bytes / 2


@pytest.mark.slow
@pytest.mark.parametrize("case", ["expert4_drops_uneven", "data2_fsdp2_expert2_drops"])
def test_capacity_drops_match_explicit_reference(dispatch_results, case):
  result = dispatch_results[case]
  assert result["dropped"] > 0, "the capacity factor should force drops here"
  assert result["dropped"] == result["dropped_ref"]
  assert result["y_err"] <= TOLERANCE and result["grad_err"] <= TOLERANCE, result
  # The drops are real: the output differs from the undropped one.
  assert result["diff_from_plain"] > 1e-2


def test_mxfp8_dispatch_is_within_mxfp8_tolerance(dispatch_results):
  result = dispatch_results["expert4_mxfp8"]
  # Exact against the dense reference on fake-quantised tokens (checked above), and so
  # different from the unquantised output, by about E4M3's relative step (2^-4).
  assert 1e-4 * result["y_scale"] < result["diff_from_plain"] <= 0.1 * result["y_scale"]


def test_moe_layer_with_router_replay_matches_no_mesh(dispatch_results):
  result = dispatch_results["moe_layer"]
  assert result["all_to_all"]
  assert result["indices_equal"]
  assert result["loads_err"] == 0.0  # loads are global: every copy counted once
  assert result["dropped"] == 0.0
  assert result["y_err"] <= TOLERANCE


@pytest.mark.slow
def test_train_steps_on_meshes_match_one_device():
  results = run_checks("train")
  reference = results.pop("one_device")
  assert set(results) == {"fsdp8", "data2_fsdp2_expert2"}
  for name, run in results.items():
    assert run["all_to_all"] == (name != "fsdp8"), name
    assert run["dropped"] == [0.0, 0.0, 0.0]
    np.testing.assert_allclose(run["losses"], reference["losses"], rtol=0, atol=TOLERANCE,
                               err_msg=name)
    # The correction-bias update saw the same global loads.
    np.testing.assert_allclose(run["bias"], reference["bias"], rtol=0, atol=1e-7,
                               err_msg=name)


@pytest.mark.parametrize("tokens,top_k,shards,factor,expected", [
    (16, 2, 4, 0.0, 32),   # no drops: every local copy could go to one shard
    (16, 2, 4, 1.0, 8),    # the balanced share
    (16, 2, 4, 1.25, 10),  # rounded up
    (16, 2, 4, 100.0, 32),  # never above the no-drop worst case
    (1, 1, 8, 0.5, 1),     # at least one slot
])
def test_capacity(tokens, top_k, shards, factor, expected):
  assert expert.capacity(tokens, top_k, shards, factor) == expected


def test_negative_capacity_factor_is_rejected():
  with pytest.raises(ValueError, match="capacity_factor"):
    expert.capacity(4, 2, 2, -1.0)


def _one_device_mesh(expert_rule):
  par = parallel.default_parallel_config()
  par.mesh.fsdp = 1
  mesh = parallel.make_mesh(par.mesh, jax.devices()[:1])
  rules = tuple((name, axes) for name, axes in parallel.rules_of(par) if name != "expert")
  return mesh, (("expert", expert_rule),) + rules


def test_no_plan_without_mesh_or_without_a_split_expert_axis():
  assert expert.plan_from_context() is None  # no ambient mesh
  mesh, rules = _one_device_mesh("expert")
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    assert expert.plan_from_context() is None  # the expert axis has size 1


def test_one_device_mesh_is_bit_identical_to_no_mesh():
  cfg = variants.get("tiny", hidden_size=32, moe=dict(intermediate_size=16))
  x_BxLxD = jax.random.normal(jax.random.key(0), (2, 4, 32))
  layer = moe.MoE(cfg)
  params = nn.unbox(layer.init(jax.random.key(1), x_BxLxD))
  apply = jax.jit(layer.apply)
  y, stats = apply(params, x_BxLxD)
  mesh, rules = _one_device_mesh("expert")
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    y_mesh, stats_mesh = apply(params, x_BxLxD)
  np.testing.assert_array_equal(y_mesh, y)
  np.testing.assert_array_equal(stats_mesh["expert_loads"], stats["expert_loads"])
  assert float(stats["dropped_copies"]) == 0.0


def test_experts_must_divide_over_shards():
  plan = expert.ExpertParallelPlan(
      jax.sharding.AbstractMesh((3,), ("expert",)), ("expert",), ("expert",))
  experts = (jnp.zeros((8, 4, 4)),)
  with pytest.raises(ValueError, match="num_experts = 8 to divide by 3"):
    expert.moe_forward(jnp.zeros((6, 4)), jnp.zeros((6, 1)), jnp.zeros((6, 1), jnp.int32),
                       experts, plan, local_dispatch=None)


@pytest.mark.parametrize("key,value", [("expert_parallel", "on"),
                                       ("ep_dispatch_quant", "fp8"),
                                       ("ep_exchange", "ragged_v2"),
                                       ("ep_capacity_factor", -0.5)])
def test_config_validation_names_the_key(key, value):
  cfg = variants.get("tiny")
  cfg.moe[key] = value
  with pytest.raises(configlib.ConfigError, match=f"moe.{key}"):
    model_config.validate(cfg)
