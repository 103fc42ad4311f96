"""Chunked token log-probs against the plain log_softmax: values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model.token_logprobs import (token_logprobs, token_logprobs_reference,
                                        vocab_chunked_nll)

B, L, D, V = 2, 11, 8, 37


def _inputs(seed, dtype=jnp.float32):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  hidden = jax.random.normal(k1, (B, L, D), dtype)
  kernel = 0.7 * jax.random.normal(k2, (D, V), dtype)
  targets = jax.random.randint(k3, (B, L), 0, V)
  return hidden, kernel, targets


# Chunks that divide, that need padding on both axes, and one chunk covering everything.
@pytest.mark.parametrize("seq_chunk,vocab_chunk", [(4, 16), (11, 37), (3, 5)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_grads_match_plain(seq_chunk, vocab_chunk, temperature):
  hidden, kernel, targets = _inputs(seq_chunk * 100 + vocab_chunk)
  weights = jax.random.normal(jax.random.key(7), (B, L))  # a non-uniform cotangent

  def loss(fn, h, w, **kw):
    return jnp.sum(weights * fn(h, w, targets, temperature, **kw))

  chunked = jax.jit(jax.value_and_grad(
      lambda h, w: loss(token_logprobs, h, w, seq_chunk=seq_chunk, vocab_chunk=vocab_chunk),
      argnums=(0, 1)))
  plain = jax.jit(jax.value_and_grad(lambda h, w: loss(token_logprobs_reference, h, w),
                                     argnums=(0, 1)))
  (value, (dh, dw)), (ref_value, (ref_dh, ref_dw)) = chunked(hidden, kernel), plain(hidden, kernel)
  np.testing.assert_allclose(value, ref_value, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dh, ref_dh, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dw, ref_dw, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      token_logprobs(hidden, kernel, targets, temperature, seq_chunk=seq_chunk,
                     vocab_chunk=vocab_chunk),
      token_logprobs_reference(hidden, kernel, targets, temperature), atol=1e-5)


def test_large_logits_stay_finite():
  # The online logsumexp rescales: logits of 1e4 would overflow a naive exp-sum.
  hidden, kernel, targets = _inputs(1)
  out = token_logprobs(hidden * 3e3, kernel, targets, vocab_chunk=8)
  ref = token_logprobs_reference(hidden * 3e3, kernel, targets)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-3)


def test_bfloat16_hidden_grads_in_input_dtypes():
  hidden, kernel, targets = _inputs(2, jnp.bfloat16)
  dh, dw = jax.grad(lambda h, w: token_logprobs(h, w, targets, vocab_chunk=8).sum(),
                    argnums=(0, 1))(hidden, kernel)
  assert dh.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
  ref_dh, ref_dw = jax.grad(lambda h, w: token_logprobs_reference(h, w, targets).sum(),
                            argnums=(0, 1))(hidden, kernel)
  np.testing.assert_allclose(np.float32(dh), np.float32(ref_dh), atol=0.05, rtol=0.05)
  np.testing.assert_allclose(np.float32(dw), np.float32(ref_dw), atol=0.05, rtol=0.05)


def test_bad_shapes_are_named():
  hidden, kernel, targets = _inputs(3)
  with pytest.raises(ValueError, match="hidden size"):
    token_logprobs(hidden, kernel[:-1], targets)
  with pytest.raises(ValueError, match="targets"):
    token_logprobs(hidden, kernel, targets[:, :-1])


@pytest.mark.parametrize("vocab_chunk", [16, 37, 5])  # padded; one chunk; padded, 8 chunks
def test_vocab_chunked_nll_values_and_grads_match_plain(vocab_chunk):
  hidden, kernel, targets = _inputs(vocab_chunk)
  weights = jax.random.normal(jax.random.key(8), (B, L))

  def grads(fn):
    return jax.jit(jax.value_and_grad(lambda h, w: jnp.sum(weights * fn(h, w)),
                                      argnums=(0, 1)))(hidden, kernel)

  value, (dh, dw) = grads(lambda h, w: vocab_chunked_nll(h, w, targets, vocab_chunk))
  ref_value, (ref_dh, ref_dw) = grads(lambda h, w: -token_logprobs_reference(h, w, targets))
  np.testing.assert_allclose(value, ref_value, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dh, ref_dh, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dw, ref_dw, rtol=1e-5, atol=1e-5)
  big = vocab_chunked_nll(hidden * 3e3, kernel, targets, vocab_chunk)
  np.testing.assert_allclose(big, -token_logprobs_reference(hidden * 3e3, kernel, targets),
                             rtol=1e-5, atol=1e-2)


def test_vocab_chunked_nll_sums_bfloat16_hidden_grads_in_float32():
  # 64 chunks: a bfloat16 running sum of the hidden gradient rounds 64 times (~17x the
  # plain path's error here); summed in float32 it stays within 2x of the plain path.
  k1, k2, k3 = jax.random.split(jax.random.key(9), 3)
  hidden = jax.random.normal(k1, (4, 64, 32), jnp.bfloat16)
  kernel = 0.3 * jax.random.normal(k2, (32, 4096), jnp.bfloat16)
  targets = jax.random.randint(k3, (4, 64), 0, 4096)
  dh = jax.grad(lambda h: vocab_chunked_nll(h, kernel, targets, 64).sum())(hidden)
  plain = jax.grad(lambda h: -token_logprobs_reference(h, kernel, targets).sum())(hidden)
  exact = jax.grad(lambda h: -token_logprobs_reference(h, kernel.astype(jnp.float32),
                                                       targets).sum())(
      hidden.astype(jnp.float32))
  assert dh.dtype == jnp.bfloat16
  error = lambda g: np.abs(np.float32(g) - exact).max() / np.abs(exact).max()
  assert error(dh) <= 2 * error(plain), (error(dh), error(plain))
  with pytest.raises(ValueError, match="vocab_chunk"):
    vocab_chunked_nll(hidden, kernel, targets, 0)
