"""The chunked online MTP distillation loss equals the full-logits computation
(c2jax.model.mtp.loss with frozen_trunk) in value, metrics and gradient, for chunk sizes
that do and do not divide the length, and its compiled memory falls with the chunk."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import model
from c2jax.model import mtp
from c2jax.rl.learner import mtp_distill
from tests.model.conftest import random_params, tiny_cfg

B, L = 2, 16


@pytest.fixture(scope="module")
def setup():
  cfg = tiny_cfg(vocab_size=64, num_layers=2, num_mtp_layers=2)
  params = random_params(cfg, seed=1)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (B, L)), jnp.int32)
  valid = np.ones((B, L), np.int32)
  valid[1, 11:] = 0
  loss_mask = np.zeros((B, L), np.int32)
  loss_mask[0, 5:] = 1
  loss_mask[1, 3:9] = 1
  batch = dict(tokens=tokens, valid=jnp.asarray(valid), loss_mask=jnp.asarray(loss_mask))
  hidden, _, _ = model.apply(cfg, params, tokens, segment_ids_BxL=batch["valid"], head=False)
  return cfg, params, hidden, batch


def _reference(cfg, params, hidden_BxLxD, batch):
  """The plain computation: full [B, L, V] main logits into mtp.loss."""
  hidden_BxLxD = jax.lax.stop_gradient(hidden_BxLxD)
  kernel = params["lm_head"]["kernel"].astype(hidden_BxLxD.dtype)
  main_logits = jax.lax.stop_gradient(jnp.einsum(
      "bld,dv->blv", hidden_BxLxD, kernel, preferred_element_type=jnp.float32))
  generated = batch["loss_mask"] * batch["valid"]
  total, metrics, moe_aux = mtp.loss(
      cfg, params, batch["tokens"], hidden_BxLxD, main_logits,
      segment_ids_BxL=batch["valid"], loss_mask_BxL=jnp.pad(generated[:, 1:], ((0, 0), (0, 1))),
      frozen_trunk=True)
  return total, metrics, moe_aux["aux_loss"]


@pytest.fixture(scope="module")
def reference(setup):
  cfg, params, hidden, batch = setup
  fn = lambda p: (lambda out: (out[0], out[1:]))(_reference(cfg, p, hidden, batch))
  (value, (metrics, aux_loss)), grads = jax.jit(jax.value_and_grad(fn, has_aux=True))(params)
  return value, metrics, aux_loss, grads


@pytest.mark.slow
@pytest.mark.parametrize("seq_chunk", [5, 8])  # 5 does not divide L = 16
def test_chunked_loss_and_gradient_match_the_full_logits(setup, reference, seq_chunk):
  cfg, params, hidden, batch = setup
  fn = lambda p: (lambda out: (out[0], out[1:]))(
      mtp_distill.loss(cfg, p, hidden, batch, seq_chunk=seq_chunk))
  (value, (metrics, aux_loss)), grads = jax.jit(jax.value_and_grad(fn, has_aux=True))(params)
  ref_value, ref_metrics, ref_aux_loss, ref_grads = reference
  assert float(ref_value) > 0
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  np.testing.assert_allclose(aux_loss, ref_aux_loss, rtol=1e-6)
  assert sorted(metrics) == sorted(ref_metrics) == ["mtp0/agree", "mtp0/kl", "mtp1/agree",
                                                    "mtp1/kl"]
  for name, ref in ref_metrics.items():
    np.testing.assert_allclose(metrics[name], ref, rtol=1e-5, err_msg=name)
  for (path, g), ref in zip(jax.tree_util.tree_leaves_with_path(grads),
                            jax.tree.leaves(ref_grads)):
    scale = float(jnp.abs(ref).max())
    np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-5 * scale,
                               err_msg=jax.tree_util.keystr(path))
  # Only the heads get a gradient (the trunk, embedding and LM head are detached).
  assert all(float(jnp.abs(g).max()) == 0.0 for k, sub in grads.items()
             if k != mtp.PARAMS_KEY for g in jax.tree.leaves(sub))


def test_bad_chunk_is_an_error(setup):
  cfg, params, hidden, batch = setup
  with pytest.raises(ValueError, match="seq_chunk is 0.*rl.mtp_seq_chunk"):
    mtp_distill.loss(cfg, params, hidden, batch, seq_chunk=0)


def _temp_bytes(cfg, seq_chunk, length):
  shapes = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  hidden = jax.ShapeDtypeStruct((1, length, cfg.hidden_size), jnp.float32)
  batch = {name: jax.ShapeDtypeStruct((1, length), jnp.int32)
           for name in ("tokens", "valid", "loss_mask")}
  grad = jax.grad(lambda p, h, b: mtp_distill.loss(cfg, p, h, b, seq_chunk=seq_chunk)[0])
  return jax.jit(grad).lower(shapes, hidden, batch).compile().memory_analysis().temp_size_in_bytes


def test_compiled_memory_falls_with_the_chunk():
  cfg = tiny_cfg(vocab_size=8192, num_layers=1, first_k_dense=1, num_mtp_layers=1)
  length = 256
  logits_bytes = length * cfg.vocab_size * 4  # one [L, V] float32 array
  whole, chunked = _temp_bytes(cfg, length, length), _temp_bytes(cfg, 16, length)
  # One chunk of the whole length holds several [L, V] float32 arrays (teacher, student,
  # their softmaxes and cotangents); chunks of 16 positions hold [16, V] ones, and what
  # remains is the MTP block's own activations.
  assert whole - chunked > 2 * logits_bytes, (whole, chunked, logits_bytes)
  assert chunked < logits_bytes, (chunked, logits_bytes)
