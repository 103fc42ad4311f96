"""Fused attention: the selector's accepted and refused shapes (GPU generations, dtypes,
GQA and MLA heads, document masks by size, explicit choices), and the fused call itself
(jax.nn.dot_product_attention with implementation='xla' on this CPU) equal to the dense
and blockwise references in values and gradients, for GQA and MLA head shapes, packed
documents with padding and context-parallel position masks; chunked prefill through the
KV cache with blockwise and fused equal to the dense cache path. The same for 'tokamax'
(tokamax.dot_product_attention, its XLA implementation on this CPU), where installed."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model import attention, init_cache
from c2jax.model import fused_attention as fused
from c2jax.model.blockwise_attention import blockwise_attention
from c2jax.parallel import context
from c2jax_kernels import platform as kernel_platform
from tests.model.conftest import ATTENTION_CASES, draw_params, tiny_cfg

B = 2
SCALE = 0.25

H100 = dict(platform="gpu", capability=(9, 0))
A100 = dict(platform="gpu", capability=(8, 0))


def _call(**overrides):
  """Kimi-K2.5 MLA heads (192 q/k, 128 v) at 4096 packed tokens in bfloat16 on an H100."""
  fields = dict(dtype="bfloat16", heads=64, kv_heads=64, qk_head_dim=192, v_head_dim=128,
                queries=4096, keys=4096, mask="documents", block=512, **H100)
  fields.update(overrides)
  return fused.AttentionCall(**fields)


@pytest.mark.parametrize("overrides", [
    {},                                                             # MLA, packed documents
    dict(mask="causal", queries=32768, keys=32768),                 # one document: no mask
    dict(heads=64, kv_heads=8, qk_head_dim=128, v_head_dim=128),    # GQA
    dict(dtype="float16", capability=(10, 0)),                      # Blackwell
    dict(heads=32, kv_heads=8, qk_head_dim=128, v_head_dim=128, **A100),  # Ampere, d <= 128
    dict(mask="positions", queries=2048, keys=4096),                # a context shard
])
def test_auto_picks_cudnn_for_shapes_it_accepts(overrides):
  call = _call(**overrides)
  assert fused.cudnn_refusal(call) is None
  assert fused.select_attention("auto", call) == fused.Choice("fused", "cuDNN takes this call")
  assert fused.select_attention("fused", call).impl == "fused"


@pytest.mark.parametrize("overrides, expected, why", [
    (dict(dtype="float32"), "blockwise", "bfloat16/float16"),
    (dict(dtype="float32", queries=256, keys=256), "dense", "bfloat16/float16"),
    (dict(queries=8192, keys=8192), "blockwise", "8192x8192 bias"),   # mask too big
    (dict(queries=511, keys=511), "dense", "even lengths"),
    (dict(mask="causal", queries=511, keys=511), "fused", "cuDNN takes"),
    (dict(mask="positions", queries=4096, keys=16384), "blockwise", "positions mask"),
    (A100, "blockwise", "head dim 192"),                              # MLA before Hopper
    (dict(qk_head_dim=100, v_head_dim=100), "blockwise", "multiple of 8"),
    (dict(qk_head_dim=264, v_head_dim=128), "blockwise", "at most 256"),
    (dict(qk_head_dim=64, v_head_dim=128), "blockwise", "never truncated"),
    (dict(heads=12, kv_heads=8, qk_head_dim=128, v_head_dim=128), "blockwise", "do not split"),
    (dict(capability=(7, 0)), "blockwise", "sm_80"),
    (dict(platform="cpu", capability=None), "blockwise", "needs a GPU"),
    (dict(platform="tpu", capability=None, queries=512, keys=512), "dense", "needs a GPU"),
])
def test_auto_falls_back_where_cudnn_refuses(overrides, expected, why):
  choice = fused.select_attention("auto", _call(**overrides))
  assert choice.impl == expected
  assert why in choice.reason


def test_explicit_choices_are_honoured_or_refused_with_the_reason():
  for impl in ("dense", "blockwise"):
    assert fused.select_attention(impl, _call()).impl == impl
  # Off GPU, 'fused' is XLA's implementation of the same call (how it is tested here).
  assert fused.select_attention("fused", _call(platform="cpu", capability=None)).impl == "fused"
  with pytest.raises(ValueError, match="'fused' but cuDNN cannot.*float32.*'auto'"):
    fused.select_attention("fused", _call(dtype="float32"))
  with pytest.raises(ValueError, match="choose one of"):
    fused.select_attention("flash", _call())
  # Not strict (prefill against the cache): cuDNN where it can, else the 'auto' fallback.
  assert fused.select_attention("fused", _call(dtype="float32"), strict=False).impl == "blockwise"
  assert fused.select_attention("fused", _call(), strict=False).impl == "fused"
  assert fused.select_attention("fused", _call(platform="cpu", capability=None),
                                strict=False).impl == "fused"


def _dense(q_BxLxHxE, k_BxTxKxE, v_BxTxKxV, q_pos, k_pos, q_seg, k_seg):
  """float32 scores, attention.position_mask, softmax, weighted values (repeat_kv order)."""
  batch, length, heads, e = q_BxLxHxE.shape
  kv_heads = k_BxTxKxE.shape[2]
  q = q_BxLxHxE.reshape(batch, length, kv_heads, heads // kv_heads, e)
  scores = jnp.einsum("blkge,btke->bkglt", q, k_BxTxKxE) * SCALE
  mask = attention.position_mask(q_pos, q_seg, k_pos, k_seg)[:, None]
  probs = attention.masked_softmax(scores, mask, jnp.float32)
  out = jnp.einsum("bkglt,btkv->blkgv", probs, v_BxTxKxV)
  return out.reshape(batch, length, heads, v_BxTxKxV.shape[-1])


def _fused(q, k, v, q_pos, k_pos, q_seg, k_seg, *, layout):
  """The model's two ways in: token order (causal + document mask) and CP (positions)."""
  if layout == "cp":
    mask = attention.position_mask(q_pos, q_seg, k_pos, k_seg)
    return fused.fused_attention(q, k, v, mask, causal=False, scale=SCALE,
                                 implementation="xla")
  mask = None if layout == "plain" else fused.document_mask(q_seg, k_seg)
  return fused.fused_attention(q, k, v, mask, causal=True, scale=SCALE, implementation="xla")


def _library(q, k, v, q_pos, k_pos, q_seg, k_seg, *, layout):
  """tokamax's call through the same two ways in (c2jax.model.fused_attention)."""
  if layout == "cp":
    mask = attention.position_mask(q_pos, q_seg, k_pos, k_seg)
    return fused.library_attention(q, k, v, mask, causal=False, scale=SCALE)
  mask = None if layout == "plain" else fused.document_mask(q_seg, k_seg)
  return fused.library_attention(q, k, v, mask, causal=True, scale=SCALE)


needs_library = pytest.mark.skipif(not kernel_platform.library_installed(),
                                   reason="tokamax: pip install -e '.[kernels]'")


def _blockwise(q, k, v, q_pos, k_pos, q_seg, k_seg):
  return blockwise_attention(q, k, v, q_pos, k_pos, q_seg, k_seg, scale=SCALE, block=8)


@functools.cache
def _value_and_grads(fn):
  def run(q, k, v, w, *masks):
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, *masks), q, k, v)
    return out, vjp(w)
  return jax.jit(run)


def _packed(rng, length, padding):
  """[B, L] positions and segment ids: three documents then `padding` slots of segment 0."""
  segments = np.zeros((B, length), np.int32)
  positions = np.zeros((B, length), np.int32)
  for row in range(B):
    cuts = sorted(rng.choice(np.arange(2, length - padding - 2), 2, replace=False))
    bounds = [0, *cuts, length - padding]
    for doc, (start, end) in enumerate(zip(bounds[:-1], bounds[1:]), start=1):
      segments[row, start:end] = doc
      positions[row, start:end] = np.arange(end - start)
    positions[row, length - padding:] = np.arange(padding)
  return jnp.asarray(positions), jnp.asarray(segments)


# name -> (heads, kv heads, q/k dim, v dim, query length, key length, layout, dtype).
# 'mla_real_heads' is MLA's true head shape (128 nope + 64 rope, v 128) at 2 heads.
CASES = {
    "gqa_plain": (4, 2, 16, 16, 19, 19, "plain", jnp.float32),
    "gqa_packed": (4, 2, 16, 16, 29, 29, "packed", jnp.float32),
    "mla_packed": (4, 4, 24, 16, 23, 23, "packed", jnp.float32),
    "mla_real_heads_packed": (2, 2, 192, 128, 21, 21, "packed", jnp.float32),
    "gqa_cp_shard": (4, 2, 16, 16, 12, 24, "cp", jnp.float32),
    "mla_packed_bf16": (4, 4, 24, 16, 23, 23, "packed", jnp.bfloat16),
}


def _inputs(name, seed):
  heads, kv_heads, e, v_dim, length, keys, layout, dtype = CASES[name]
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)  # noqa: E731
  q, k = normal(B, length, heads, e), normal(B, keys, kv_heads, e)
  v, w = normal(B, keys, kv_heads, v_dim), normal(B, length, heads, v_dim)
  if layout == "plain":
    pos = jnp.broadcast_to(jnp.arange(length), (B, length))
    ones = jnp.ones((B, length), jnp.int32)
    masks = (pos, pos, ones, ones)
  elif layout == "packed":
    _, seg = _packed(rng, length, padding=4)
    order = jnp.broadcast_to(jnp.arange(length), (B, length))
    masks = (order, order, seg, seg)   # the model's token-order path
  else:
    pos, seg = _packed(rng, keys, padding=0)
    pos, seg = context.to_balanced(pos, 2), context.to_balanced(seg, 2)
    masks = (pos[:, :length], pos, seg[:, :length], seg)
  return (q, k, v, w, *masks), layout, dtype


def _check_against_dense(call, name):
  """`call` (the model's two ways in) on case `name` equals dense float32 attention in
  values and q, k, v gradients; returns (inputs, layout, dtype, out, grads)."""
  inputs, layout, dtype = _inputs(name, seed=len(name))
  # The reference always runs in float32 on the same (possibly bfloat16-rounded) inputs.
  as_f32 = [x.astype(jnp.float32) if x.dtype == dtype else x for x in inputs]
  out_ref, grads_ref = _value_and_grads(_dense)(*as_f32)
  out, grads = _value_and_grads(functools.partial(call, layout=layout))(*inputs)
  assert out.dtype == dtype and out.shape == out_ref.shape
  atol = 1e-5 if dtype == jnp.float32 else 0.05
  np.testing.assert_allclose(out.astype(jnp.float32), out_ref, rtol=0, atol=atol)
  for what, got, want in zip("qkv", grads, grads_ref):
    np.testing.assert_allclose(got.astype(jnp.float32), want, rtol=0, atol=atol * 4,
                               err_msg=f"d{what}")
  assert all(float(jnp.abs(g.astype(jnp.float32)).max()) > 0.1 for g in grads_ref)
  return inputs, layout, dtype, out, grads


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_call_equals_dense_and_blockwise(name):
  inputs, layout, dtype, out, grads = _check_against_dense(_fused, name)
  if dtype == jnp.float32 and layout != "cp":
    out_block, grads_block = _value_and_grads(_blockwise)(*inputs)
    np.testing.assert_allclose(out, out_block, rtol=0, atol=1e-5)
    for got, want in zip(grads, grads_block):
      np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@needs_library
@pytest.mark.parametrize("name", ["gqa_packed", "mla_real_heads_packed", "gqa_cp_shard",
                                  "mla_packed_bf16"])
def test_library_call_equals_dense(name):
  """tokamax takes MLA's 128-wide values beside 192-wide queries as they are (no padding)."""
  _check_against_dense(_library, name)


def test_tokamax_is_taken_as_asked_and_never_by_auto():
  for call in (_call(), _call(platform="cpu", capability=None), _call(platform="tpu")):
    choice = fused.select_attention("tokamax", call)
    assert choice.impl == "tokamax" and "tokamax" in choice.reason
    assert fused.select_attention("auto", call).impl != "tokamax"
  assert "tokamax's xla" in fused.select_attention("tokamax", _call(platform="cpu")).reason
  assert "tokamax's mosaic" in fused.select_attention("tokamax", _call()).reason


def test_fused_call_refuses_what_it_cannot_express():
  q = jnp.zeros((1, 4, 2, 8))
  with pytest.raises(ValueError, match="value head dim 16 > q/k head dim 8"):
    fused.fused_attention(q, q, jnp.zeros((1, 4, 2, 16)), None, causal=True, scale=1.0)
  with pytest.raises(ValueError, match="causal=True needs as many keys"):
    fused.fused_attention(q, jnp.zeros((1, 6, 2, 8)), jnp.zeros((1, 6, 2, 8)), None,
                          causal=True, scale=1.0)


def _attention_layer(name, impl):
  """(cfg, params, jitted apply) of one tiny attention layer with `impl`, tiles of 4."""
  cfg = tiny_cfg(attention_impl=impl, attention_block=4, **ATTENTION_CASES[name])
  module = attention.ATTENTION[cfg.attention](cfg)
  x = jnp.zeros((B, 4, cfg.hidden_size))
  positions = jnp.broadcast_to(jnp.arange(4), (B, 4))
  shapes = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.key(0), x, positions)))
  params = draw_params(shapes["params"], cfg.init_std)
  return cfg, params, jax.jit(lambda p, x, pos, cache: module.apply(
      {"params": p}, x, pos, None, cache))


@pytest.mark.parametrize("name", sorted(ATTENTION_CASES))
def test_chunked_prefill_through_the_cache_equals_dense(name):
  """Two prefill chunks (7 then 5 tokens, rows at different offsets) into a 16-slot cache:
  blockwise (MLA: absorbed multi-query heads) and fused equal the dense cache path."""
  outputs = {}
  impls = ("blockwise", "fused") + (("tokamax",) if kernel_platform.library_installed() else ())
  for impl in ("dense", *impls):
    cfg, params, run = _attention_layer(name, impl)
    x = jax.random.normal(jax.random.key(3), (B, 12, cfg.hidden_size))
    cache = jax.tree.map(lambda c: c[0], init_cache(cfg, B, 16)["dense_layers"])
    offsets = jnp.asarray([[0], [2]])          # row 1 starts at position 2
    first, cache = run(params, x[:, :7], jnp.arange(7)[None] + offsets, cache)
    second, cache = run(params, x[:, 7:], jnp.arange(7, 12)[None] + offsets, cache)
    outputs[impl] = (first, second)
  for impl in impls:
    for got, want in zip(outputs[impl], outputs["dense"]):
      np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=impl)
