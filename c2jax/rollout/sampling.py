"""Jittable token sampling: temperature, top-k, top-p, per-sequence seeds, log-probs.

Every argument is per row, so one compiled step serves a batch whose rows use different
settings. Shape legend: B rows, V vocab.

Randomness: the key for a token is fold_in(fold_in(key(seed), position), stream), so what
a sequence samples depends only on its own seed and positions, not on its slot or on the
other sequences in the batch (speculative decoding uses other streams for its drafts and
accept tests).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


def row_keys(seeds_B: jax.Array, positions_B: jax.Array, stream: int = 0) -> jax.Array:
  """One PRNG key per row from its (seed, position of the token being drawn, stream)."""
  def one(seed, position):
    key = jax.random.fold_in(jax.random.key(seed.astype(jnp.uint32)), position)
    return jax.random.fold_in(key, stream)
  return jax.vmap(one)(seeds_B, positions_B)


def _scaled(logits_BxV: jax.Array, temperature_B: jax.Array) -> jax.Array:
  # Temperature 0 (greedy) reports the plain log-softmax, as temperature 1 does.
  t_B = jnp.where(temperature_B > 0, temperature_B, 1.0).astype(jnp.float32)
  return logits_BxV.astype(jnp.float32) / t_B[:, None]


def policy_logprobs(logits_BxV: jax.Array, temperature_B: jax.Array) -> jax.Array:
  """log_softmax(logits / T) [B, V]: the distribution a learner scores tokens under."""
  return jax.nn.log_softmax(_scaled(logits_BxV, temperature_B), axis=-1)


def sampling_logprobs(logits_BxV, temperature_B, top_k_B, top_p_B) -> jax.Array:
  """[B, V] log-probabilities of the distribution actually sampled from.

  Rows with temperature 0 are one-hot on the argmax (log 0 / -inf), so greedy decoding
  and the speculative accept rule need no separate code path.
  """
  scaled_BxV = _scaled(logits_BxV, temperature_B)
  batch, vocab = scaled_BxV.shape
  order_BxV = jnp.argsort(-scaled_BxV, axis=-1)
  sorted_BxV = jnp.take_along_axis(scaled_BxV, order_BxV, axis=-1)
  rank_V = jnp.arange(vocab)
  keep_sorted_BxV = (top_k_B[:, None] <= 0) | (rank_V[None, :] < top_k_B[:, None])
  probs_sorted_BxV = jax.nn.softmax(jnp.where(keep_sorted_BxV, sorted_BxV, NEG_INF), axis=-1)
  # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
  mass_before_BxV = jnp.cumsum(probs_sorted_BxV, axis=-1) - probs_sorted_BxV
  keep_sorted_BxV &= mass_before_BxV < top_p_B[:, None]
  rows_Bx1 = jnp.arange(batch)[:, None]
  keep_BxV = jnp.zeros((batch, vocab), bool).at[rows_Bx1, order_BxV].set(keep_sorted_BxV)
  greedy_BxV = rank_V[None, :] == jnp.argmax(scaled_BxV, axis=-1)[:, None]
  keep_BxV = jnp.where((temperature_B > 0)[:, None], keep_BxV, greedy_BxV)
  return jax.nn.log_softmax(jnp.where(keep_BxV, scaled_BxV, NEG_INF), axis=-1)


def recorded_logprobs(logp_BxV, logits_BxV, temperature_B, tokens_B) -> jax.Array:
  """[B] log-probabilities the engine reports for drawn tokens: under the distribution
  actually sampled from (`logp_BxV`, from sampling_logprobs: temperature, then top-k /
  top-p renormalised), so that a learner's importance ratio pi / mu is exact. Greedy rows
  (temperature 0), whose sampled distribution is a point mass (log-prob 0 for every
  draw), report the model's own log_softmax instead."""
  sampled_B = jnp.take_along_axis(logp_BxV, tokens_B[:, None], axis=-1)[:, 0]
  model_BxV = policy_logprobs(logits_BxV, jnp.ones_like(temperature_B))
  model_B = jnp.take_along_axis(model_BxV, tokens_B[:, None], axis=-1)[:, 0]
  return jnp.where(temperature_B > 0, sampled_B, model_B)


def sample(logits_BxV, temperature_B, top_k_B, top_p_B, keys_B):
  """(tokens_B int32, logprobs_B float32): draws and their log-probabilities under the
  distribution they were drawn from (see recorded_logprobs)."""
  logp_BxV = sampling_logprobs(logits_BxV, temperature_B, top_k_B, top_p_B)
  tokens_B = jax.vmap(jax.random.categorical)(keys_B, logp_BxV).astype(jnp.int32)
  return tokens_B, recorded_logprobs(logp_BxV, logits_BxV, temperature_B, tokens_B)
