"""Speculative decoding with the model's first MTP module as the drafter.

A slot with n tokens in its cache and a pending token t_n runs, per step:
  1. draft: the MTP module at position n-1 takes (h_{n-1}, t_n) and proposes d_1; applied
     again to its own output (as vLLM reuses DeepSeek-V3's single MTP layer) it proposes
     d_2..d_D. Drafts are sampled with the request's own temperature/top-k/top-p (greedy
     at temperature 0);
  2. verify: one main-model forward over [t_n, d_1..d_D] at positions n..n+D;
  3. accept: the standard rule (Leviathan et al. 2023; Chen et al. 2023): keep d_i with
     probability min(1, p_i(d_i) / q_i(d_i)) while they are kept, then draw the next token
     from normalise(max(0, p - q)) at the first rejection, or from p after all D. The
     output has exactly the target distribution; at temperature 0 both are one-hot, so it
     is exactly greedy decoding;
  4. rewrite the MTP cache at positions n..n+D-1 from the verified hidden states, so every
     MTP cache slot below a sequence's length holds (true hidden, true next token).
Main-cache entries written for rejected drafts sit above the sequence's length and are
overwritten before any query reads them.

Prefill also fills the MTP cache of the prompt positions. An extend re-feeds the last
cached token (its MTP entry needs the first new token), rewriting that token's main
cache entry with the current weights.

Shape legend: S slots, C chunk, G = D + 1 verified tokens, D drafts, V vocab, H hidden.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import mtp
from c2jax.rollout import sampling as sampling_lib

_DRAFT, _ACCEPT, _RESIDUAL = 1, 2, 3  # PRNG streams besides 0 (plain sampling)


@dataclasses.dataclass
class AcceptanceStats:
  """Accepted drafts per sequence-step, accumulated over a run."""
  steps: int = 0
  accepted: int = 0

  def record(self, accepted: np.ndarray) -> None:
    self.steps += int(np.size(accepted))
    self.accepted += int(np.sum(accepted))

  @property
  def tokens_per_step(self) -> float:
    """Mean tokens a sequence gains per decode step (1 + accepted drafts)."""
    return 1.0 + self.accepted / max(self.steps, 1)


def check_drafter(cfg, params, num_draft: int) -> None:
  if cfg.num_mtp_layers < 1 or mtp.PARAMS_KEY not in params:
    raise ValueError(
        f"num_draft_tokens = {num_draft} needs MTP modules: set config.num_mtp_layers >= 1 "
        f"and pass params with a '{mtp.PARAMS_KEY}' subtree (c2jax.model.mtp.init), or use "
        "num_draft_tokens = 0.")


def init_mtp_cache(cfg, num_slots: int, max_length: int) -> dict:
  return mtp.init_layer_cache(cfg, num_slots, max_length)


def accept(target_logp_SxGxV, draft_logp_SxDxV, drafts_SxD, accept_keys_S, residual_keys_S):
  """The accept/reject rule: (accepted drafts a_S in 0..D, next token_S drawn from the
  residual at index a, or from the target at index D when every draft was kept)."""
  num_draft = drafts_SxD.shape[1]
  target_SxGxV = jnp.exp(target_logp_SxGxV)
  draft_SxDxV = jnp.exp(draft_logp_SxDxV)
  p_SxD = jnp.take_along_axis(target_SxGxV[:, :num_draft], drafts_SxD[..., None], -1)[..., 0]
  q_SxD = jnp.take_along_axis(draft_SxDxV, drafts_SxD[..., None], -1)[..., 0]
  u_SxD = jax.vmap(lambda key: jax.random.uniform(key, (num_draft,)))(accept_keys_S)
  kept_SxD = (u_SxD * q_SxD < p_SxD).astype(jnp.int32)
  accepted_S = jnp.sum(jnp.cumprod(kept_SxD, axis=1), axis=1)
  index_Sx1x1 = accepted_S[:, None, None]
  p_SxV = jnp.take_along_axis(target_SxGxV, index_Sx1x1, axis=1)[:, 0]
  q_padded_SxGxV = jnp.pad(draft_SxDxV, ((0, 0), (0, 1), (0, 0)))
  q_SxV = jnp.take_along_axis(q_padded_SxGxV, index_Sx1x1, axis=1)[:, 0]
  residual_SxV = jnp.maximum(p_SxV - q_SxV, 0.0)
  # Rounding can leave no residual mass where p == q; p itself is then the right law.
  residual_SxV = jnp.where(residual_SxV.sum(-1, keepdims=True) > 0, residual_SxV, p_SxV)
  next_S = jax.vmap(jax.random.categorical)(residual_keys_S, jnp.log(residual_SxV))
  return accepted_S, next_S.astype(jnp.int32)


def _rows(tree, slot):
  return jax.tree.map(lambda c: jax.lax.dynamic_slice_in_dim(c, slot, 1, axis=1), tree)


def _put(tree, rows, slot):
  return jax.tree.map(lambda c, r: jax.lax.dynamic_update_slice_in_dim(c, r, slot, axis=1),
                      tree, rows)


def _mtp_rows(tree, slot):
  return jax.tree.map(lambda c: jax.lax.dynamic_slice_in_dim(c, slot, 1, axis=0), tree)


def _mtp_put(tree, rows, slot):
  return jax.tree.map(lambda c, r: jax.lax.dynamic_update_slice_in_dim(c, r, slot, axis=0),
                      tree, rows)


def prefill(cfg, params, cache, mtp_cache, last_hidden_SxH, slot, tokens_1xC, start, count,
            following, temperature, top_k, top_p, seed):
  """As prefill.prefill_chunk, plus the chunk's MTP cache entries and the slot's last
  hidden state. `following` is the token after the chunk (-1: the one sampled here)."""
  positions_1xC = start + jnp.arange(tokens_1xC.shape[1], dtype=jnp.int32)[None]
  logits_1xCxV, aux, rows, hidden_1xCxH = mtp.forward_with_hidden(
      cfg, params, tokens_1xC, positions_BxL=positions_1xC, cache=_rows(cache, slot))
  last_1xV = jax.lax.dynamic_index_in_dim(logits_1xCxV[0], count - 1, keepdims=True)
  keys = sampling_lib.row_keys(seed[None], (start + count)[None])
  token_1, logprob_1 = sampling_lib.sample(last_1xV, temperature[None], top_k[None],
                                           top_p[None], keys)
  after = jnp.where(following >= 0, following, token_1[0])
  next_1xC = jnp.pad(tokens_1xC[:, 1:], ((0, 0), (0, 1))).at[0, count - 1].set(after)
  _, _, mtp_rows = mtp.apply_layer(cfg, params, 0, hidden_1xCxH, next_1xC, positions_1xC,
                                   _mtp_rows(mtp_cache, slot))
  last_hidden_SxH = last_hidden_SxH.at[slot].set(
      jax.lax.dynamic_index_in_dim(hidden_1xCxH[0], count - 1, keepdims=False))
  return (_put(cache, rows, slot), _mtp_put(mtp_cache, mtp_rows, slot), last_hidden_SxH,
          token_1[0], logprob_1[0], aux["expert_indices"][:, 0])


def decode(cfg, params, cache, mtp_cache, last_hidden_SxH, tokens_S, lengths_S, active_S,
           temperature_S, top_k_S, top_p_S, seeds_S, *, num_draft: int):
  """One speculative step over all slots: (caches, last hidden, new tokens [S, G],
  their logprobs [S, G], counts [S] (1 + accepted drafts), routing [Lm, S, G, K])."""
  cache_length = jax.tree.leaves(cache)[0].shape[2]
  # Inactive slots run at positions > max_length, so every cache write of theirs drops.
  n_S = jnp.where(active_S, lengths_S, cache_length + 1)
  settings = (temperature_S, top_k_S, top_p_S)

  h_Sx1xH, token_S, drafts, draft_logps = last_hidden_SxH[:, None], tokens_S, [], []
  for i in range(num_draft):
    h_Sx1xH, logits_Sx1xV, mtp_cache = mtp.apply_layer(
        cfg, params, 0, h_Sx1xH, token_S[:, None], (n_S - 1 + i)[:, None], mtp_cache)
    q_SxV = sampling_lib.sampling_logprobs(logits_Sx1xV[:, 0], *settings)
    keys = sampling_lib.row_keys(seeds_S, n_S + 1 + i, _DRAFT)
    token_S = jax.vmap(jax.random.categorical)(keys, q_SxV).astype(jnp.int32)
    drafts.append(token_S)
    draft_logps.append(q_SxV)
  drafts_SxD = jnp.stack(drafts, axis=1)

  verify_SxG = jnp.concatenate([tokens_S[:, None], drafts_SxD], axis=1)
  width = num_draft + 1
  positions_SxG = n_S[:, None] + jnp.arange(width, dtype=jnp.int32)[None]
  logits_SxGxV, aux, cache, hidden_SxGxH = mtp.forward_with_hidden(
      cfg, params, verify_SxG, positions_BxL=positions_SxG, cache=cache)
  slots, vocab = logits_SxGxV.shape[0], logits_SxGxV.shape[-1]

  def flat(x):  # per-row settings, repeated for each verified token
    return jnp.repeat(x, width, axis=0)

  target_SxGxV = sampling_lib.sampling_logprobs(
      logits_SxGxV.reshape(-1, vocab), *map(flat, settings)).reshape(slots, width, vocab)
  accepted_S, next_S = accept(
      target_SxGxV, jnp.stack(draft_logps, axis=1), drafts_SxD,
      sampling_lib.row_keys(seeds_S, n_S + 1, _ACCEPT),
      sampling_lib.row_keys(seeds_S, n_S + 1, _RESIDUAL))

  slot_index = jnp.arange(width)[None]
  new_SxG = jnp.where(slot_index == accepted_S[:, None], next_S[:, None],
                      jnp.pad(drafts_SxD, ((0, 0), (0, 1))))
  # Accepted drafts and the residual draw are distributed exactly as the target, so the
  # target's (truncated, renormalised) log-prob is the one to record.
  logprobs_SxG = sampling_lib.recorded_logprobs(
      target_SxGxV.reshape(-1, vocab), logits_SxGxV.reshape(-1, vocab), flat(temperature_S),
      new_SxG.reshape(-1)).reshape(slots, width)

  _, _, mtp_cache = mtp.apply_layer(cfg, params, 0, hidden_SxGxH[:, :num_draft], drafts_SxD,
                                    positions_SxG[:, :num_draft], mtp_cache)
  last_hidden_SxH = jnp.take_along_axis(hidden_SxGxH, accepted_S[:, None, None], axis=1)[:, 0]
  return (cache, mtp_cache, last_hidden_SxH, new_SxG,
          logprobs_SxG, accepted_S + 1, aux["expert_indices"])
