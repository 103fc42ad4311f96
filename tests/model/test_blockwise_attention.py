"""Blockwise attention: forward and gradients equal the dense reference (MLA and GQA head
shapes, ragged block counts, packed documents with padding, shuffled context-parallel
layouts), the tiny model's loss and gradients with attention_impl='blockwise' (and
'fused') equal 'dense', config validation, compiled memory that grows linearly in L, and the
context-parallel layer (subprocess, 8 fake devices) equal to one device."""

import functools
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import config as configlib
from c2jax import model
from c2jax.model import attention
from c2jax.model import config as model_config
from c2jax.model.blockwise_attention import blockwise_attention
from c2jax.parallel import context
from c2jax_kernels import platform as kernel_platform
from tests.model.conftest import ATTENTION_CASES, random_params, tiny_cfg

B = 2
SCALE = 0.3


def _dense(q_BxLxHxE, k_BxTxKxE, v_BxTxKxV, q_pos, k_pos, q_seg, k_seg):
  """The dense reference: float32 scores, the same position + segment mask as
  attention.position_mask, softmax, weighted values (query head j*G + i reads kv head j)."""
  batch, length, heads, e = q_BxLxHxE.shape
  kv_heads = k_BxTxKxE.shape[2]
  q_BxLxKxGxE = q_BxLxHxE.reshape(batch, length, kv_heads, heads // kv_heads, e)
  scores = jnp.einsum("blkge,btke->bkglt", q_BxLxKxGxE, k_BxTxKxE) * SCALE
  mask = attention.position_mask(q_pos, q_seg, k_pos, k_seg)[:, None]
  probs = attention.masked_softmax(scores, mask, jnp.float32)
  out = jnp.einsum("bkglt,btkv->blkgv", probs, v_BxTxKxV)
  return out.reshape(batch, length, heads, v_BxTxKxV.shape[-1])


def _packed(rng, length, cuts, padding):
  """[B, L] positions and segment ids: documents split at `cuts`, `padding` slots of
  segment 0 at the end (positions keep counting there, as packers leave them)."""
  segments = np.zeros((B, length), np.int32)
  positions = np.zeros((B, length), np.int32)
  for row in range(B):
    bounds = [0, *sorted(rng.choice(np.arange(2, length - padding - 2), cuts, replace=False)),
              length - padding]
    for doc, (start, end) in enumerate(zip(bounds[:-1], bounds[1:]), start=1):
      segments[row, start:end] = doc
      positions[row, start:end] = np.arange(end - start)
    positions[row, length - padding:] = np.arange(padding)
  return jnp.asarray(positions), jnp.asarray(segments)


# name -> (heads, kv heads, q/k dim, v dim, query length, key length, block, layout).
# 'mla' is MLA's tiny head shapes (nope 16 + rope 8, v 16, one kv head per head); 'cp'
# is a context shard's local queries (the balanced layout's chunks 0 and 3 of 4) against
# the whole gathered sequence, with the mask from true positions.
CASES = {
    "mla_packed": (4, 4, 24, 16, 37, 37, 8, "packed"),
    "gqa_packed": (4, 2, 16, 16, 29, 29, 8, "packed"),
    "mla_one_doc_one_tile": (4, 4, 24, 16, 13, 13, 64, "plain"),
    "gqa_cp_shard": (4, 2, 16, 16, 24, 48, 16, "cp"),
}


@pytest.fixture(scope="module")
def jitted():
  """Forward and vjp of both implementations, jitted once per static block size."""
  def value_and_grads(fn, q, k, v, w, *masks):
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, *masks), q, k, v)
    return out, vjp(w)

  def blockwise(block):
    def fn(q, k, v, q_pos, k_pos, q_seg, k_seg):
      return blockwise_attention(q, k, v, q_pos, k_pos, q_seg, k_seg, scale=SCALE,
                                 block=block)
    return jax.jit(functools.partial(value_and_grads, fn))

  return {"dense": jax.jit(functools.partial(value_and_grads, _dense)),
          "blockwise": functools.cache(blockwise)}


def _case_inputs(name, seed):
  heads, kv_heads, e, v_dim, length, keys, _, layout = CASES[name]
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
  q, k = normal(B, length, heads, e), normal(B, keys, kv_heads, e)
  v, w = normal(B, keys, kv_heads, v_dim), normal(B, length, heads, v_dim)
  if layout == "plain":
    pos = jnp.broadcast_to(jnp.arange(length), (B, length))
    masks = (pos, pos, jnp.ones((B, length), jnp.int32), jnp.ones((B, keys), jnp.int32))
  elif layout == "packed":
    pos, seg = _packed(rng, length, cuts=2, padding=5)
    masks = (pos, pos, seg, seg)
  else:
    pos, seg = _packed(rng, keys, cuts=2, padding=0)
    pos, seg = context.to_balanced(pos, 2), context.to_balanced(seg, 2)
    masks = (pos[:, :length], pos, seg[:, :length], seg)
  return (q, k, v, w, *masks)


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_gradients_equal_dense(jitted, name):
  inputs = _case_inputs(name, seed=len(name))
  out_ref, grads_ref = jitted["dense"](*inputs)
  out, grads = jitted["blockwise"](CASES[name][6])(*inputs)
  np.testing.assert_allclose(out, out_ref, rtol=0, atol=1e-5)
  for what, got, want in zip("qkv", grads, grads_ref):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=f"d{what}")
  # The gradients are not trivially small: the comparison above is meaningful.
  assert all(float(jnp.abs(g).max()) > 0.1 for g in grads_ref)


def test_documents_are_isolated_and_padding_rows_are_finite(jitted):
  inputs = _case_inputs("gqa_packed", seed=3)
  q, k, v, w, q_pos, k_pos, q_seg, k_seg = inputs
  out, grads = jitted["blockwise"](8)(*inputs)
  # Changing keys/values of document 2 leaves every query outside document 2 unchanged.
  other_doc = (k_seg == 2)[:, :, None, None]
  out2, _ = jitted["blockwise"](8)(q, jnp.where(other_doc, -k, k), jnp.where(other_doc, 2 * v, v),
                                   w, q_pos, k_pos, q_seg, k_seg)
  outside = np.asarray(q_seg != 2)
  np.testing.assert_array_equal(np.asarray(out)[outside], np.asarray(out2)[outside])
  assert not np.allclose(np.asarray(out)[~outside], np.asarray(out2)[~outside])
  assert all(bool(jnp.isfinite(x).all()) for x in (out, *grads))


@pytest.mark.parametrize("name", sorted(ATTENTION_CASES))
def test_tiny_model_loss_and_gradients_equal_dense(name):
  length = 20  # not a multiple of the block (8): three query and key tiles, the last ragged
  # One (dense-FFN) layer: attention is what differs, and each compile costs seconds.
  # tokamax: tokamax.dot_product_attention (its XLA implementation on a CPU), if installed.
  others = ("blockwise", "fused") + (("tokamax",) if kernel_platform.library_installed()
                                     else ())
  cfgs = {impl: tiny_cfg(attention_impl=impl, attention_block=8, num_layers=1,
                         **ATTENTION_CASES[name]) for impl in ("dense", *others)}
  params = random_params(cfgs["dense"])
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, cfgs["dense"].vocab_size, (B, length + 1)))
  positions, segments = _packed(rng, length, cuts=1, padding=3)

  def loss(cfg, params):
    logits, _, _ = model.apply(cfg, params, tokens[:, :-1], positions_BxL=positions,
                               segment_ids_BxL=segments)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.mean(jnp.where(segments > 0, nll, 0.0))

  results = {impl: jax.jit(jax.value_and_grad(functools.partial(loss, cfg)))(params)
             for impl, cfg in cfgs.items()}
  loss_dense, grads_dense = results["dense"]
  for impl in others:  # fused: jax.nn.dot_product_attention, XLA on CPU
    loss_impl, grads_impl = results[impl]
    np.testing.assert_allclose(loss_impl, loss_dense, rtol=0, atol=1e-5, err_msg=impl)
    for path, got in jax.tree_util.tree_leaves_with_path(grads_impl):
      want = functools.reduce(lambda tree, key: tree[key.key], path, grads_dense)
      np.testing.assert_allclose(got, want, rtol=0, atol=1e-5,
                                 err_msg=f"{impl} {jax.tree_util.keystr(path)}")


def test_config_rejects_unknown_impl_and_bad_block():
  with pytest.raises(configlib.ConfigError, match="attention_impl"):
    model_config.validate(tiny_cfg(attention_impl="flash"))
  with pytest.raises(configlib.ConfigError, match="attention_block"):
    model_config.validate(tiny_cfg(attention_block=0))


def _temp_bytes(fn, length, heads=4, e=16):
  """Compiled temporaries of grad(loss) through a 2-layer scan of attention (CPU). The
  positions are loop-invariant, as in the model's layer scan: differentiating the scan
  must not hoist per-tile masks out of it."""
  spec = jax.ShapeDtypeStruct((1, length, heads, e), jnp.float32)
  pos = jax.ShapeDtypeStruct((1, length), jnp.int32)

  def loss(x, weights, positions):
    def layer(h, w):
      return fn(h * w, h, h, positions, positions, None, None), None
    return jnp.sum(jax.lax.scan(layer, x, weights)[0] ** 2)

  weights = jax.ShapeDtypeStruct((2,), jnp.float32)
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(spec, weights, pos).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_compiled_memory_grows_linearly_not_quadratically():
  blockwise = functools.partial(blockwise_attention, scale=SCALE, block=128)
  small, large = _temp_bytes(blockwise, 512), _temp_bytes(blockwise, 1024)
  assert large / small < 2.5, (small, large)
  # The dense reference at the same size holds [H, L, L] float32 scores: far more.
  assert _temp_bytes(_dense_no_segments, 1024) > 4 * large


def _dense_no_segments(q, k, v, q_pos, k_pos, q_seg, k_seg):
  del q_seg, k_seg
  ones = jnp.ones(q_pos.shape, jnp.int32)
  return _dense(q, k, v, q_pos, k_pos, ones, ones)


# Runs in a fresh process (8 fake CPU devices must be set before jax is imported): the
# context-parallel checks of tests/parallel with blockwise attention configured, so both
# the one-device layer and the context=2 layer take the blockwise path.
_CP_SCRIPT = """
import json
from tests.parallel import context_parallel_checks as checks
for name, overrides in checks.CASES.items():
  overrides.update(attention_impl="blockwise", attention_block=8)
print(json.dumps({name: checks.attention_layer(name, (2,)) for name in sorted(checks.CASES)}))
"""


@pytest.mark.slow
def test_context_parallel_blockwise_matches_one_device():
  """Local queries against gathered keys, balanced and contiguous layouts, MLA and GQA:
  forward, parameter and input gradients within 1e-5 of one device."""
  repo = pathlib.Path(__file__).parents[2]
  env = dict(os.environ, PYTHONPATH=str(repo), JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-c", _CP_SCRIPT], capture_output=True, text=True,
                          cwd=repo, env=env, timeout=900)
  assert result.returncode == 0, result.stderr[-4000:]
  results = json.loads(result.stdout.strip().splitlines()[-1])
  for name in ATTENTION_CASES:
    assert results[name]["cp2_jaxpr"] == {"shard_map": True, "all_gather": True,
                                          "reduce_scatter": True}, name
    for layout in ("cp2_balanced", "cp2_contiguous"):
      for what, error in results[name][layout].items():
        assert error <= 1e-5, (name, layout, what, error)
