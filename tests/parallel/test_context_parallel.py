"""Context parallelism: load-balanced layout, when the CP attention path is taken (traced on
abstract meshes, no devices needed), config validation, and multi-device equivalence with
one device (attention forward + gradients; 3 real train steps) in a subprocess."""

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
from c2jax.model import attention, variants
from c2jax.parallel import DEFAULT_RULES, MESH_AXES, context
from c2jax.plan import shardings as plan
from c2jax.train import jobs

CHECKS = pathlib.Path(__file__).with_name("context_parallel_checks.py")
REPO = CHECKS.parents[2]


def _work_per_rank(positions_BxL, segment_ids_BxL, shards):
  """Unmasked query-key pairs whose query lies on each rank (contiguous [L / CP] slices
  of the layout the arrays are in)."""
  mask = attention.position_mask(positions_BxL, segment_ids_BxL, positions_BxL,
                                 segment_ids_BxL)[:, 0]
  per_query_B_L = np.asarray(mask).sum(-1)
  return per_query_B_L.reshape(per_query_B_L.shape[0], shards, -1).sum((0, 2))


@pytest.mark.parametrize("length,shards", [(16, 2), (64, 4), (48, 3), (64, 8)])
def test_balanced_layout_round_trips_and_equalises_causal_work(length, shards):
  order = context.balanced_order(length, shards)
  assert sorted(order.tolist()) == list(range(length))
  chunk = length // (2 * shards)
  first_rank = order[:length // shards]  # chunks 0 and 2 * CP - 1
  assert first_rank.tolist() == [*range(chunk), *range(length - chunk, length)]

  rng = np.random.default_rng(0)
  batch = {"inputs": rng.integers(0, 100, (2, length)), "loss_mask": rng.random((2, length)),
           "positions": np.broadcast_to(np.arange(length), (2, length))}
  balanced = context.balance_batch(batch, shards)
  for key, value in batch.items():
    np.testing.assert_array_equal(context.from_balanced(balanced[key], shards), value)
  np.testing.assert_array_equal(
      context.from_balanced(context.to_balanced(jnp.asarray(batch["inputs"]), shards), shards),
      batch["inputs"])

  positions = jnp.asarray(batch["positions"])
  contiguous = _work_per_rank(positions, None, shards)
  even = _work_per_rank(jnp.asarray(balanced["positions"]), None, shards)
  assert contiguous.sum() == even.sum() == 2 * length * (length + 1) // 2
  assert len(set(even.tolist())) == 1, even
  assert contiguous[-1] > contiguous[0]  # what the layout fixes


def test_layout_rejects_lengths_that_do_not_split():
  with pytest.raises(ValueError, match="does not divide by 4.*2 \\* 2 chunks"):
    context.balanced_order(18, 2)
  context.check_length(18, 2, balanced=False)
  with pytest.raises(ValueError, match="split over 4 context shards"):
    context.check_length(18, 4, balanced=False)


def test_length_axes_follow_the_rules_and_sizes():
  sizes = dict(data=1, fsdp=4, expert=1, context=2, tensor=1)
  assert context.length_axes(sizes, DEFAULT_RULES) == ("context",)
  assert context.num_shards(sizes, DEFAULT_RULES) == 2
  assert context.length_axes({**sizes, "context": 1}, DEFAULT_RULES) == ()
  two_axes = (("batch", "fsdp"), ("length", ("context", "tensor")))
  assert context.num_shards({**sizes, "tensor": 2}, two_axes) == 4
  assert context.length_axes(sizes, ()) == ()
  with pytest.raises(ValueError, match="'length' to \\['seq'\\]"):
    context.length_axes(sizes, (("length", "seq"),))
  assert context.length_axes() == ()  # no ambient mesh here


def _job(**mesh):
  cfg = jobs.job_defaults("tiny")
  cfg.parallel.mesh.update({"data": 1, "fsdp": 1, "expert": 1, "context": 1, "tensor": 1,
                            **mesh})
  return cfg


def test_job_validation_names_the_key():
  cfg = _job(context=4, fsdp=2)
  cfg.train.seq_len = 36  # divides by 4 shards, not by the 8 balanced chunks
  with pytest.raises(configlib.ConfigError, match="train.seq_len.*2 \\* 4 chunks"):
    jobs.validate(cfg, 8)
  cfg.parallel.context_load_balance = False
  jobs.validate(cfg, 8)
  cfg.model.num_mtp_layers = 1
  jobs.validate(cfg, 8)  # contiguous shards keep MTP's shifted tokens in order
  cfg.train.seq_len, cfg.parallel.context_load_balance = 32, True
  with pytest.raises(configlib.ConfigError, match="context_load_balance.*MTP"):
    jobs.validate(cfg, 8)


def _eqns(jaxpr):
  for eqn in jaxpr.eqns:
    yield eqn
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _eqns(inner)


def _gathered_shapes(fn, *args, mesh_sizes):
  """Per-shard shapes of every all_gather over 'context' when `fn` is traced on an
  abstract mesh of `mesh_sizes` with the default rules, plus whether shard_map appears."""
  auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  mesh = jax.sharding.AbstractMesh(tuple(mesh_sizes[a] for a in MESH_AXES), MESH_AXES,
                                   axis_types=auto)
  with jax.sharding.use_abstract_mesh(mesh), nn.logical_axis_rules(DEFAULT_RULES):
    eqns = list(_eqns(jax.make_jaxpr(fn)(*args).jaxpr))
  gathered = [tuple(eqn.invars[0].aval.shape) for eqn in eqns
              if eqn.primitive.name == "all_gather" and eqn.params["axis_name"] == ("context",)]
  return gathered, any(eqn.primitive.name == "shard_map" for eqn in eqns)


@pytest.fixture(scope="module")
def mla_layer():
  cfg = variants.get("tiny")
  module = attention.MLA(cfg)
  x = jnp.zeros((4, 16, cfg.hidden_size))
  positions = jnp.zeros((4, 16), jnp.int32)
  params = jax.eval_shape(lambda: module.init(jax.random.key(0), x, positions))["params"]
  return cfg, module, params, x, positions


def test_mla_gathers_only_latents_and_only_in_training(mla_layer):
  cfg, module, params, x, positions = mla_layer
  cp2 = dict(data=1, fsdp=4, expert=1, context=2, tensor=1)
  train = lambda p: module.apply({"params": p}, x, positions, positions)[0]
  gathered, shard_map = _gathered_shapes(train, params, mesh_sizes=cp2)
  # Per shard: batch 4 / fsdp 4 = 1 row, 16 / 2 = 8 tokens: positions, segment ids,
  # the kv latent and the rope key; never per-head keys or values.
  assert shard_map and sorted(gathered) == sorted(
      [(1, 8), (1, 8), (1, 8, cfg.kv_lora_rank), (1, 8, cfg.qk_rope_head_dim)])

  unpacked = lambda p: module.apply({"params": p}, x, positions)[0]
  assert sorted(_gathered_shapes(unpacked, params, mesh_sizes=cp2)[0]) == sorted(
      [(1, 8), (1, 8, cfg.kv_lora_rank), (1, 8, cfg.qk_rope_head_dim)])

  cache = {"c_kv": jnp.zeros((4, 32, cfg.kv_lora_rank)),
           "k_rope": jnp.zeros((4, 32, cfg.qk_rope_head_dim))}
  decode = lambda p: module.apply({"params": p}, x, positions, None, cache)
  assert _gathered_shapes(decode, params, mesh_sizes=cp2) == ([], False)
  init = lambda: module.init(jax.random.key(0), x, positions)
  assert _gathered_shapes(init, mesh_sizes=cp2) == ([], False)
  no_cp = dict(cp2, context=1, fsdp=8)
  assert _gathered_shapes(train, params, mesh_sizes=no_cp) == ([], False)


def test_without_context_axes_the_layer_is_unchanged(mla_layer):
  """No mesh, or a mesh whose 'length' axes have size 1: the plain path (no shard_map, no
  gather), with the same bits either way."""
  _, module, params, x, positions = mla_layer
  train = lambda p: module.apply({"params": p}, x, positions, positions)[0]
  plain = str(jax.make_jaxpr(train)(params))
  assert "shard_map" not in plain and "all_gather" not in plain
  x = jax.random.normal(jax.random.key(1), x.shape)
  params = jax.tree.map(lambda s: 0.1 * jax.random.normal(jax.random.key(2), s.shape),
                        params)
  run = jax.jit(lambda p, x: module.apply({"params": p}, x, positions, positions)[0])
  one_device = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape((1,) * 5), MESH_AXES)
  with jax.set_mesh(one_device), nn.logical_axis_rules(DEFAULT_RULES):
    meshed = run(params, x)
  np.testing.assert_array_equal(meshed, run(params, x))


def _run_checks(which):
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, str(CHECKS), which], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=900)
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_attention_on_2_and_4_context_shards_matches_one_device():
  """Packed documents, float32: forward and gradients (params, inputs) within 1e-5 of one
  device, in the load-balanced and the contiguous layout; the program gathers over the
  context axis inside shard_map and reduce-scatters in the backward pass."""
  results = _run_checks("attention")
  assert set(results["mla"]) == {"cp2_balanced", "cp2_contiguous", "cp2_jaxpr",
                                 "cp4_balanced", "cp4_contiguous", "cp4_jaxpr"}
  for name, cases in results.items():
    for case, values in cases.items():
      if case.endswith("jaxpr"):
        assert values == {"shard_map": True, "all_gather": True, "reduce_scatter": True}, (
            name, case)
      else:
        for what, error in values.items():
          assert error <= 1e-5, (name, case, what, error)


@pytest.mark.slow
def test_train_steps_on_context_meshes_match_one_device():
  """3 real train steps of the tiny MLA + MoE model with packed, padded rows."""
  results = _run_checks("train")
  losses = results["losses"]
  one = losses.pop("one_device")
  assert set(losses) == {"context=2,fsdp=4", "expert=4,context=2"}
  for name, values in losses.items():
    np.testing.assert_allclose(values, one, rtol=0, atol=1e-5, err_msg=name)
  assert one[2] < one[0]
  assert all(results["gathers_over_context"].values()), results["gathers_over_context"]
  assert all(results["batch_balanced"].values()), results["batch_balanced"]


def test_context_axis_also_shards_parameters_like_fsdp():
  """CP folded into FSDP: every parameter's 'embed' dimension is split over context too,
  so CP ranks do not hold replicated weights."""
  par = parallel.default_parallel_config()
  par.mesh.update({"data": 1, "fsdp": 4, "expert": 1, "context": 2, "tensor": 1})
  plans = plan.param_plans(variants.get("tiny"), par, 8)
  with_embed = [p for p in plans if "embed" in p.logical]
  assert len(with_embed) > 10
  for p in with_embed:
    axes = p.mesh_axes[p.logical.index("embed")]
    assert "context" in axes and "fsdp" in axes, (p.path, p.mesh_axes)
