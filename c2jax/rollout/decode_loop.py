"""Several decode steps in one compiled program: the model, the sampler and the stop
checks all run on device, and the host reads the results once per chunk.

Per slot and step: feed the pending token at its position, sample the next one, and
check the stops the device can see (a stop token, the request's max_tokens, the cache
length). A slot that stops is fed its final token once more on the following step (the
drain: that token's expert routing is recorded and the cache holds the whole sequence),
then sits idle, fed at position max_length where cache writes drop. Stop strings need a
detokenizer, so only the host finds them; it ends the sequence at the stop and ignores
what the device sampled after it (those cache rows lie above the sequence's length and
are rewritten before anything reads them).

The loop ends after `steps` steps (at most `num_steps`, the compiled size of its output
buffers: one program serves every chunk length), or after the first step in which a slot
finished:
its generation goes back to the caller (an agent loop can run its tools meanwhile) and
its slot can take a queued request without waiting for the whole chunk.

Sampling keys depend on (seed, position) only, so a chunk of k steps samples exactly
the tokens that k one-step chunks would.

Shape legend: S slots, N steps per chunk, W stop tokens per slot (padded with -1),
V vocab, Lm MoE layers, K experts per token.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from c2jax import model
from c2jax.rollout import sampling as sampling_lib


def decode_steps(cfg, num_steps: int, params, cache, tokens_S, lengths_S, active_S,
                 draining_S, temperature_S, top_k_S, top_p_S, seeds_S, stop_tokens_SxW,
                 budget_S, steps=None, logprobs_S=None):
  """Up to `steps` (an int32 scalar; None: `num_steps`) decode steps over all slots.

  tokens_S: each slot's pending token; lengths_S: its position (tokens in the cache);
  active_S: slots to run; draining_S: active slots that only feed their final token;
  budget_S: tokens a generating slot may still sample (max_tokens left); logprobs_S:
  slots that want their tokens' log-probs (None: all); when no active slot does, the
  steps skip computing them and the log-probs returned are NaN.
  Returns (cache, new tokens [S, N], their log-probs [S, N], fed [S] (steps each slot
  was fed; new tokens past that are padding), routing of the fed tokens [Lm, S, N, K]).
  """
  # Cache leaves are [layers, S, T, ...], or [S, T, ...] when kept per layer.
  cache_length = jax.tree.leaves(cache)[0].shape[1 if model.has_unstacked_layers(cache)
                                                  else 2]

  wanted = True if logprobs_S is None else jnp.any(logprobs_S & active_S)

  def step(cache, tokens_S, positions_S):
    logits_Sx1xV, aux, cache = model.apply(cfg, params, tokens_S[:, None],
                                           positions_BxL=positions_S[:, None], cache=cache)
    keys = functools.partial(sampling_lib.row_keys, seeds_S, positions_S + 1)
    new_S, step_logprobs_S = sampling_lib.sample(logits_Sx1xV[:, 0], temperature_S, top_k_S,
                                                 top_p_S, keys, logprobs=wanted)
    return cache, new_S, step_logprobs_S, aux["expert_indices"][:, :, 0]

  routing_shape = jax.eval_shape(step, cache, tokens_S, lengths_S)[3]
  slots = tokens_S.shape[0]
  num_moe, _, top_k = routing_shape.shape

  def body(carry):
    (i, cache, token_S, length_S, live_S, drain_S, sampled_S, fed_S, finished_any,
     new_SxN, logprobs_SxN, routing_LmxSxNxK) = carry
    positions_S = jnp.where(live_S, length_S, cache_length)
    cache, new_S, logprob_S, routing_LmxSxK = step(cache, token_S, positions_S)
    new_SxN = jax.lax.dynamic_update_index_in_dim(new_SxN, new_S, i, axis=1)
    logprobs_SxN = jax.lax.dynamic_update_index_in_dim(logprobs_SxN, logprob_S, i, axis=1)
    routing_LmxSxNxK = jax.lax.dynamic_update_index_in_dim(
        routing_LmxSxNxK, routing_LmxSxK.astype(jnp.int32), i, axis=2)
    generating_S = live_S & ~drain_S
    sampled_S = sampled_S + generating_S
    stop_S = (jnp.any(new_S[:, None] == stop_tokens_SxW, axis=1) | (sampled_S >= budget_S)
              | (length_S + 2 >= cache_length))
    finished_S = live_S & drain_S
    return (i + 1, cache, jnp.where(generating_S, new_S, token_S), length_S + live_S,
            live_S & ~finished_S, drain_S | (generating_S & stop_S), sampled_S,
            fed_S + live_S, finished_any | jnp.any(finished_S), new_SxN, logprobs_SxN,
            routing_LmxSxNxK)

  limit = num_steps if steps is None else jnp.minimum(steps, num_steps)

  def cond(carry):
    i, live_S, finished_any = carry[0], carry[4], carry[8]
    return (i < limit) & jnp.any(live_S) & ~finished_any

  zeros_S = jnp.zeros((slots,), jnp.int32)
  carry = (jnp.int32(0), cache, tokens_S.astype(jnp.int32), lengths_S.astype(jnp.int32),
           active_S, draining_S & active_S, zeros_S, zeros_S, jnp.bool_(False),
           jnp.zeros((slots, num_steps), jnp.int32),
           jnp.zeros((slots, num_steps), jnp.float32),
           jnp.zeros((num_moe, slots, num_steps, top_k), jnp.int32))
  carry = jax.lax.while_loop(cond, body, carry)
  cache, fed_S, new_SxN, logprobs_SxN, routing_LmxSxNxK = (
      carry[1], carry[7], carry[9], carry[10], carry[11])
  return cache, new_SxN, logprobs_SxN, fed_S, routing_LmxSxNxK
