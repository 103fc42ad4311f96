"""The full model: output contract, logical axes, packing, remat/scan, router replay."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import model
from c2jax.model import variants
from tests.model.conftest import ATTENTION_CASES, VOCAB, tiny_cfg

B, L = 2, 16
VOCABULARY = {"batch", "length", "embed", "vocab", "heads", "kv_heads", "head_dim", "q_lora",
              "kv_lora", "mlp", "expert", "expert_mlp", "layers", "cache_length"}


def _tokens(seed=0, shape=(B, L)):
  return jax.random.randint(jax.random.key(seed), shape, 0, VOCAB, jnp.int32)


def test_forward_contract(tiny_model):
  cfg = tiny_model.cfg
  logits, aux, cache = tiny_model.apply(tiny_model.params, _tokens())
  assert logits.shape == (B, L, VOCAB) and logits.dtype == jnp.float32
  assert cache is None
  num_moe, k = cfg.num_layers - cfg.first_k_dense, cfg.moe.num_experts_per_tok
  assert aux["expert_loads"].shape == (num_moe, cfg.moe.num_experts)
  assert aux["expert_indices"].shape == (num_moe, B, L, k)
  assert aux["expert_indices"].dtype == jnp.int32
  # Every layer routes each token copy somewhere: loads sum to B * L * K per layer.
  np.testing.assert_allclose(aux["expert_loads"].sum(-1), B * L * k)
  forward = jax.eval_shape(functools.partial(model.forward, cfg), tiny_model.params, _tokens())
  assert forward.shape == (B, L, VOCAB) and forward.dtype == jnp.float32


def test_init_values():
  cfg = tiny_cfg(num_layers=1, first_k_dense=1, vocab_size=2048, init_std=0.05)
  params = jax.jit(functools.partial(model.init, cfg))(jax.random.key(0))
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    if path[-1].key == "scale":
      np.testing.assert_array_equal(leaf, 1.0)
    else:  # kernels ~ N(0, init_std), as HF's _init_weights
      assert float(jnp.std(leaf)) == pytest.approx(cfg.init_std, rel=0.1), path
  assert params["embed"]["embedding"].shape == (2048, cfg.hidden_size)


def test_bfloat16_model_still_returns_float32_logits():
  cfg = tiny_cfg(dtype="bfloat16", param_dtype="bfloat16")
  params = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    # The correction bias stays float32 (its balancing steps are tiny).
    expected = jnp.float32 if path[-1].key == "correction_bias" else jnp.bfloat16
    assert leaf.dtype == expected, jax.tree_util.keystr(path)
  logits = jax.eval_shape(functools.partial(model.forward, cfg), params, _tokens())
  assert logits.dtype == jnp.float32 and logits.shape == (B, L, VOCAB)


def test_no_moe_layers_gives_empty_stats():
  cfg = tiny_cfg(num_layers=2, first_k_dense=2)
  params = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  assert "moe_layers" not in params and params["dense_layers"]["mlp_norm"]["scale"].shape == (
      2, cfg.hidden_size)
  _, aux, _ = jax.eval_shape(functools.partial(model.apply, cfg), params, _tokens())
  assert aux["expert_loads"].shape == (0, cfg.moe.num_experts)
  assert aux["expert_indices"].shape == (0, B, L, cfg.moe.num_experts_per_tok)


@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_every_parameter_has_logical_axes_of_its_rank(case):
  cfg = tiny_cfg(**ATTENTION_CASES[case])
  shapes = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  axes = model.param_axes(cfg)
  flat_axes = dict(jax.tree_util.tree_leaves_with_path(
      axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))
  flat_shapes = dict(jax.tree_util.tree_leaves_with_path(shapes))
  assert flat_axes.keys() == flat_shapes.keys()
  for path, spec in flat_axes.items():
    name = jax.tree_util.keystr(path)
    assert len(spec) == flat_shapes[path].ndim, name
    assert set(spec) <= VOCABULARY, name
    assert (spec[0] == "layers") == ("_layers" in name), name
  # A job's start takes both from one trace of init: the same trees.
  assert model.abstract_params(cfg) == (shapes, axes)


@pytest.mark.parametrize("variant,billions", [
    ("kimi_k25", 1026.4), ("deepseek_v3", 671.0), ("qwen3_moe_30b_a3b", 30.5)])
def test_real_variants_init_abstractly(variant, billions):
  cfg = variants.get(variant)
  shapes = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  # The main model: the published totals leave out MTP modules (DeepSeek-V3 has one).
  shapes.pop("mtp_layers", None)
  total = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))
  assert total / 1e9 == pytest.approx(billions, rel=2e-3)


def test_packed_documents_match_separate_runs(mla_model):
  half = L // 2
  tokens = _tokens(seed=3)
  segments = jnp.concatenate([jnp.ones((B, half), jnp.int32),
                              2 * jnp.ones((B, half), jnp.int32)], axis=1)
  positions = jnp.tile(jnp.arange(half, dtype=jnp.int32), (B, 2))
  run = functools.partial(mla_model.apply, mla_model.params, positions_BxL=positions)
  packed, _, _ = run(tokens, segment_ids_BxL=segments)
  separate, _, _ = mla_model.apply(
      mla_model.params, jnp.concatenate([tokens[:, :half], tokens[:, half:]], axis=0))
  np.testing.assert_allclose(packed[:, :half], separate[:B], atol=1e-4)
  np.testing.assert_allclose(packed[:, half:], separate[B:], atol=1e-4)
  # As one document, the second half sees the first, so its logits change.
  joined, _, _ = run(tokens, segment_ids_BxL=jnp.ones((B, L), jnp.int32))
  assert not np.allclose(joined[:, half:], separate[B:], atol=1e-3)


def _loss_and_grads(cfg, params, tokens):
  def loss(p):
    logits = model.forward(cfg, p, tokens)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
        logits, jnp.roll(tokens, -1, axis=1)[..., None], -1)[..., 0])
  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.slow
def test_remat_policies_and_unroll_do_not_change_loss_or_grads(mla_model):
  tokens = _tokens(seed=4)
  base_loss, base_grads = _loss_and_grads(mla_model.cfg, mla_model.params, tokens)
  for remat, unroll in (("full", 1), ("save_dots", 2)):
    cfg = tiny_cfg(remat=remat, scan_unroll=unroll, **ATTENTION_CASES["mla"])
    loss, grads = _loss_and_grads(cfg, mla_model.params, tokens)
    np.testing.assert_allclose(loss, base_loss, rtol=1e-6)
    jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6), grads, base_grads)


def test_full_remat_holds_when_the_layer_scan_is_unrolled():
  """With the stack unrolled (scan_unroll = layers, as `c2jax plan` compiles for its cost
  figures) or leaving a remainder, forward and backward are straight-line code; without
  jax.checkpoint's CSE barrier XLA merges the recomputation with the forward pass and
  keeps every layer's activations (the temporaries of remat = 'none')."""
  tokens = _tokens(seed=6, shape=(4, 64))

  def temporaries(unroll):
    cfg = tiny_cfg(num_layers=4, first_k_dense=4, remat="full", scan_unroll=unroll)
    params = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
    loss = lambda p: jnp.mean(jax.nn.logsumexp(model.forward(cfg, p, tokens), -1))
    return jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes

  in_a_loop = temporaries(1)
  for unroll in (3, 4):  # a remainder layer; the whole stack
    assert temporaries(unroll) <= 1.1 * in_a_loop, unroll


def test_program_size_is_independent_of_depth():
  def hlo_lines(num_layers):
    cfg = tiny_cfg(num_layers=num_layers)
    params = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
    text = jax.jit(functools.partial(model.forward, cfg)).lower(params, _tokens()).as_text()
    return len(text.splitlines())
  assert hlo_lines(3) == hlo_lines(12)


def test_router_replay_reaches_each_scanned_layer(mla_model):
  cfg, params, apply = mla_model.cfg, mla_model.params, mla_model.apply
  tokens = _tokens(seed=5)
  logits, aux, _ = apply(params, tokens)
  replayed, replay_aux, _ = apply(params, tokens, routing=aux["expert_indices"])
  np.testing.assert_allclose(replayed, logits, atol=1e-6)
  np.testing.assert_array_equal(replay_aux["expert_indices"], aux["expert_indices"])

  # Layer i is told to use experts (2i, 2i+1) everywhere: its stats must say exactly that.
  num_moe, k, e = cfg.num_layers - cfg.first_k_dense, cfg.moe.num_experts_per_tok, \
      cfg.moe.num_experts
  forced = jnp.broadcast_to(
      (jnp.arange(num_moe)[:, None] * k + jnp.arange(k)[None, :])[:, None, None, :],
      (num_moe, B, L, k)).astype(jnp.int32)
  forced_logits, forced_aux, _ = apply(params, tokens, routing=forced)
  np.testing.assert_array_equal(forced_aux["expert_indices"], forced)
  expected_loads = np.zeros((num_moe, e))
  for layer in range(num_moe):
    expected_loads[layer, layer * k:(layer + 1) * k] = B * L
  np.testing.assert_allclose(forced_aux["expert_loads"], expected_loads)
  assert not np.allclose(forced_logits, logits, atol=1e-3)

  def replay_loss(p):
    return jnp.sum(model.forward(cfg, p, tokens, routing=forced) ** 2)
  router_grad = jax.jit(jax.grad(replay_loss))(params)["moe_layers"]["moe"]["router"]["kernel"]
  assert np.all(np.abs(np.asarray(router_grad)).reshape(num_moe, -1).sum(-1) > 0)


def test_bad_inputs_are_named_errors(mla_model):
  cfg, params = mla_model.cfg, mla_model.params
  with pytest.raises(ValueError, match="routing has shape"):
    jax.eval_shape(functools.partial(model.apply, cfg), params, _tokens(),
                   routing=jnp.zeros((1, B, L, 1), jnp.int32))
  cache = model.init_cache(cfg, B, 32)
  with pytest.raises(ValueError, match="explicit positions"):
    jax.eval_shape(functools.partial(model.apply, cfg), params, _tokens(), cache=cache)
  with pytest.raises(ValueError, match="init_cache"):
    jax.eval_shape(functools.partial(model.apply, cfg), params, _tokens(),
                   positions_BxL=jnp.zeros((B, L), jnp.int32),
                   cache={"moe_layers": cache["moe_layers"]})


def test_trainable_mask_excludes_only_correction_biases(mla_model):
  mask = model.trainable_mask(mla_model.params)
  frozen = [jax.tree_util.keystr(path) for path, trainable in
            jax.tree_util.tree_leaves_with_path(mask) if not trainable]
  assert frozen == ["['moe_layers']['moe']['router']['correction_bias']"]
  assert sum(jax.tree.leaves(mask)) == len(jax.tree.leaves(mla_model.params)) - 1


def _constrained_specs(jaxpr) -> set[tuple]:
  """Specs of every sharding constraint in a jaxpr, scan/remat bodies included."""
  found = set()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "sharding_constraint":
      found.add(tuple(eqn.params["sharding"].spec))
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          found |= _constrained_specs(inner)
  return found


@pytest.mark.parametrize("case,expected", [
    ("mla", {("batch", "length", "q_lora"), ("batch", "length", "kv_lora"),
             ("batch", "cache_length", "kv_lora")}),
    ("gqa", {("batch", "length", "kv_heads", "head_dim")}),
])
def test_main_activations_carry_logical_axes(case, expected):
  """A one-device mesh with one axis per logical name makes each constraint show its
  logical names in the jaxpr (nothing is compiled)."""
  cfg = tiny_cfg(**ATTENTION_CASES[case])
  names = sorted(VOCABULARY)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape((1,) * len(names)), names)
  params = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  apply = functools.partial(model.apply, cfg)
  with jax.set_mesh(mesh), nn.logical_axis_rules([(n, n) for n in names]):
    found = _constrained_specs(jax.make_jaxpr(apply)(params, _tokens()).jaxpr)
    found |= _constrained_specs(jax.make_jaxpr(apply)(
        params, _tokens(), positions_BxL=jnp.zeros((B, L), jnp.int32),
        cache=model.init_cache(cfg, B, 32)).jaxpr)
  expected = expected | {("batch", "length", "embed"), ("batch", "length", "vocab"),
                         ("batch", "length", "mlp"), ("batch", "length", "heads", "head_dim")}
  assert expected <= found, expected - found
