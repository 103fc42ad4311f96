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
# argmax's block of a row (the entries reduced to one maximum in its first pass).
ARGMAX_BLOCK = 256


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


def _first_index_of(x_BxN: jax.Array, target_Bx1: jax.Array) -> jax.Array:
  """[B] int32: the least index along the last axis holding target (a NaN target: the
  first NaN), or N where none does."""
  index_BxN = jax.lax.broadcasted_iota(jnp.int32, x_BxN.shape, x_BxN.ndim - 1)
  hit_BxN = (x_BxN == target_Bx1) | (jnp.isnan(x_BxN) & jnp.isnan(target_Bx1))
  return jnp.min(jnp.where(hit_BxN, index_BxN, x_BxN.shape[-1]), axis=-1)


def argmax(x_BxV: jax.Array) -> jax.Array:
  """[B] int32 jnp.argmax(x, axis=-1): the first maximal index (a NaN counts as maximal,
  the first NaN wins, wherever the backend's max reduction propagates NaN).

  One pass over the row: the maximum of each block of ARGMAX_BLOCK entries (the largest
  power of two up to it that divides V), then the first block holding the row's maximum
  and the first entry of that block holding it, over [B, V / block] and [B, block] only.
  XLA:CPU runs jnp.argmax's variadic (value, index) reduce unvectorised (2.0-5.3x slower
  than this form over a vocabulary row), and an index pass over the whole row (max, then
  the least index holding it) costs three more passes there: the broadcast maximum and
  the selected indices materialised, and their reduction. The greedy sampler (argmax
  and log-prob) ran 1.17-1.36x faster this way at [1-32, 8192-16384]
  (tools/bench/sampler.py, 2026-12-02; docs/benchmarks.md).

  XLA:CPU's YNNPACK max reduction over a long row skips NaNs, so there a row holding a
  NaN gets the argmax of its other entries; the engine's log-prob of such a row is NaN
  (token_logprobs), which says so."""
  rows, vocab = x_BxV.shape
  block = ARGMAX_BLOCK
  while vocab % block:
    block //= 2
  blocks_BxNxK = x_BxV.reshape(rows, vocab // block, block)
  block_max_BxN = jnp.max(blocks_BxNxK, axis=-1)
  max_Bx1 = jnp.max(block_max_BxN, axis=-1, keepdims=True)
  # In range even if the two reductions disagree on a NaN (then no block matches).
  first_block_B = jnp.minimum(_first_index_of(block_max_BxN, max_Bx1), vocab // block - 1)
  chosen_BxK = jnp.take_along_axis(blocks_BxNxK, first_block_B[:, None, None], axis=1)[:, 0]
  return first_block_B * block + _first_index_of(chosen_BxK, max_Bx1)


def _truncated(scaled_BxV, top_k_B, top_p_B) -> jax.Array:
  """[B, V] bool: the tokens top-k then top-p keep, in descending order of value with
  ties broken by token index (a stable descending sort). The kept set is a prefix of that
  order, so it is found from the last kept (value, index) pair, with no scatter back."""
  vocab = scaled_BxV.shape[-1]
  index_BxV = jax.lax.broadcasted_iota(jnp.int32, scaled_BxV.shape, 1)
  negated_BxV, order_BxV = jax.lax.sort((-scaled_BxV, index_BxV), dimension=1,
                                        is_stable=True, num_keys=1)
  sorted_BxV = -negated_BxV
  rank_V = jnp.arange(vocab)
  keep_sorted_BxV = (top_k_B[:, None] <= 0) | (rank_V[None, :] < top_k_B[:, None])
  probs_sorted_BxV = jax.nn.softmax(jnp.where(keep_sorted_BxV, sorted_BxV, NEG_INF), axis=-1)
  # Keep the smallest prefix whose mass reaches top_p (the first token always stays);
  # top_p 1 keeps everything, whatever the rounding of the running sum.
  mass_before_BxV = jnp.cumsum(probs_sorted_BxV, axis=-1) - probs_sorted_BxV
  keep_sorted_BxV &= (mass_before_BxV < top_p_B[:, None]) | (top_p_B[:, None] >= 1)
  last_Bx1 = jnp.maximum(keep_sorted_BxV.sum(-1, keepdims=True) - 1, 0)
  value_Bx1 = jnp.take_along_axis(sorted_BxV, last_Bx1, axis=-1)
  index_Bx1 = jnp.take_along_axis(order_BxV, last_Bx1, axis=-1)
  return (scaled_BxV > value_Bx1) | ((scaled_BxV == value_Bx1) & (index_BxV <= index_Bx1))


def sampling_logprobs(logits_BxV, temperature_B, top_k_B, top_p_B) -> jax.Array:
  """[B, V] log-probabilities of the distribution actually sampled from.

  Rows with temperature 0 are one-hot on the argmax (log 0 / -inf), so greedy decoding
  and the speculative accept rule need no separate code path. The sort that top-k /
  top-p need runs only when some sampling row asks for a truncation (a greedy or plain
  temperature batch pays for none).
  """
  scaled_BxV = _scaled(logits_BxV, temperature_B)
  vocab = scaled_BxV.shape[-1]
  truncates_B = (temperature_B > 0) & (((top_k_B > 0) & (top_k_B < vocab)) | (top_p_B < 1))
  keep_BxV = jax.lax.cond(
      jnp.any(truncates_B), _truncated,
      lambda scaled, *_: jnp.ones(scaled.shape, bool), scaled_BxV, top_k_B, top_p_B)
  rank_V = jnp.arange(vocab)
  greedy_BxV = rank_V[None, :] == argmax(scaled_BxV)[:, None]
  keep_BxV = jnp.where((temperature_B > 0)[:, None], keep_BxV, greedy_BxV)
  return jax.nn.log_softmax(jnp.where(keep_BxV, scaled_BxV, NEG_INF), axis=-1)


def token_logprobs(logits_BxV: jax.Array, tokens_B: jax.Array) -> jax.Array:
  """[B] log_softmax(logits)[b, tokens[b]] (float32), the same arithmetic as
  jax.nn.log_softmax, without the [B, V] result: a decode step needs one entry a row, and
  on CPU each full [B, V] pass costs as much as the reductions themselves."""
  x_BxV = logits_BxV.astype(jnp.float32)
  max_Bx1 = jnp.max(x_BxV, axis=-1, keepdims=True, initial=-jnp.inf)
  shifted_B = (jnp.take_along_axis(x_BxV, tokens_B[:, None], axis=-1) - max_Bx1)[:, 0]
  return shifted_B - jnp.log(jnp.sum(jnp.exp(x_BxV - max_Bx1), axis=-1))


def recorded_logprobs(logp_BxV, logits_BxV, temperature_B, tokens_B) -> jax.Array:
  """[B] log-probabilities the engine reports for drawn tokens: under the distribution
  actually sampled from (`logp_BxV`, from sampling_logprobs: temperature, then top-k /
  top-p renormalised), so that a learner's importance ratio pi / mu is exact. Greedy rows
  (temperature 0), whose sampled distribution is a point mass (log-prob 0 for every
  draw), report the model's own log_softmax instead."""
  sampled_B = jnp.take_along_axis(logp_BxV, tokens_B[:, None], axis=-1)[:, 0]
  return _reported(sampled_B, logits_BxV, temperature_B, tokens_B)


def _reported(sampled_B, logits_BxV, temperature_B, tokens_B) -> jax.Array:
  return jnp.where(temperature_B > 0, sampled_B, token_logprobs(logits_BxV, tokens_B))


def draw(logp_BxV: jax.Array, keys_B: jax.Array) -> jax.Array:
  """[B] int32 tokens drawn from exp(logp_BxV) by inverting the CDF at one uniform per
  row: O(V) arithmetic and one random number a row (a Gumbel-max draw would need V).
  A token of probability 0 is never drawn; a one-hot row gives its token."""
  vocab = logp_BxV.shape[-1]
  probs_BxV = jnp.exp(logp_BxV.astype(jnp.float32))
  cdf_BxV = jnp.cumsum(probs_BxV, axis=-1)
  u_B = jax.vmap(lambda key: jax.random.uniform(key, ()))(keys_B)
  target_Bx1 = (u_B * cdf_BxV[:, -1])[:, None]
  first_above_B = jnp.sum(cdf_BxV <= target_Bx1, axis=-1)
  # Rounding may leave no entry above the target: take the last token with mass.
  index_BxV = jax.lax.broadcasted_iota(jnp.int32, probs_BxV.shape, 1)
  last_positive_B = jnp.max(jnp.where(probs_BxV > 0, index_BxV, -1), axis=-1)
  last_positive_B = jnp.where(last_positive_B < 0, vocab - 1, last_positive_B)
  return jnp.minimum(first_above_B, last_positive_B).astype(jnp.int32)


def sample(logits_BxV, temperature_B, top_k_B, top_p_B, keys_B, logprobs=True):
  """(tokens_B int32, logprobs_B float32): draws and their log-probabilities under the
  distribution they were drawn from (see recorded_logprobs).

  logprobs: a bool scalar (traced or not); False skips the greedy rows' log-prob (the
  sum of exponentials over each row) and returns NaN log-probs for every row.

  keys_B: the rows' PRNG keys, or a function of no arguments that returns them (row_keys
  partially applied): then they are derived only when some row samples. On CPU a key
  costs a rolled threefry loop of ~50 small ops per derivation, more than a tiny
  model's whole greedy decode step.

  An all-greedy batch takes the argmax of the logits (what the one-hot rows of
  sampling_logprobs draw) and builds no [B, V] distribution: the argmax's pass over the
  logits and the log-prob's two (max, sum of exponentials) instead of about ten."""
  greedy_B = argmax(logits_BxV.astype(jnp.float32))

  def sampled():
    logp_BxV = sampling_logprobs(logits_BxV, temperature_B, top_k_B, top_p_B)
    keys = keys_B() if callable(keys_B) else keys_B
    tokens_B = jnp.where(temperature_B > 0, draw(logp_BxV, keys), greedy_B)
    return tokens_B, jnp.take_along_axis(logp_BxV, tokens_B[:, None], axis=-1)[:, 0]

  tokens_B, sampled_B = jax.lax.cond(
      jnp.any(temperature_B > 0), sampled,
      lambda: (greedy_B, jnp.zeros(greedy_B.shape, jnp.float32)))
  if logprobs is True:
    return tokens_B, _reported(sampled_B, logits_BxV, temperature_B, tokens_B)
  return tokens_B, jax.lax.cond(
      logprobs, lambda: _reported(sampled_B, logits_BxV, temperature_B, tokens_B),
      lambda: jnp.full(tokens_B.shape, jnp.nan, jnp.float32))
