"""KV-cache decoding reproduces teacher-forced logits (MLA absorbed path and GQA).

Two rows with prompts of different lengths share one cache: each row's tokens are written
at its own positions, so after prefill the rows decode from different slots.
"""

import jax.numpy as jnp
import numpy as np

from c2jax import model
from tests.model.conftest import VOCAB

PROMPT_LENGTHS = (5, 9)
STEPS = 5
CACHE_LENGTH = 16
TOL = 1e-4


def test_greedy_decode_matches_teacher_forcing(tiny_model):
  cfg, params, apply = tiny_model.cfg, tiny_model.params, tiny_model.apply
  batch, prefill_length = len(PROMPT_LENGTHS), max(PROMPT_LENGTHS)
  rng = np.random.default_rng(0)
  prompts = rng.integers(0, VOCAB, (batch, prefill_length)).astype(np.int32)
  positions = np.broadcast_to(np.arange(prefill_length, dtype=np.int32),
                              (batch, prefill_length))
  # Row 0's prompt is shorter: its tail is padding, written to slots 5..8 and later
  # overwritten by decode steps before any query can read them.
  cache = model.init_cache(cfg, batch, CACHE_LENGTH, jnp.float32)
  prefill_logits, _, cache = apply(params, jnp.asarray(prompts), positions_BxL=positions,
                                   cache=cache)

  lengths = np.array(PROMPT_LENGTHS)
  sequences = [list(prompts[b, :lengths[b]]) for b in range(batch)]
  next_logits = np.asarray(prefill_logits)[np.arange(batch), lengths - 1]
  step_logits = []
  for _ in range(STEPS):
    next_tokens = next_logits.argmax(-1).astype(np.int32)
    for b in range(batch):
      sequences[b].append(int(next_tokens[b]))
    step_inputs = (jnp.asarray(next_tokens[:, None]), jnp.asarray(lengths[:, None], jnp.int32))
    logits, _, cache = apply(params, step_inputs[0], positions_BxL=step_inputs[1],
                             cache=cache)
    lengths = lengths + 1
    next_logits = np.asarray(logits)[:, 0]
    step_logits.append(next_logits)

  # Teacher forcing: the whole sequences in one causal pass (row 0 right-padded).
  full_length = max(len(s) for s in sequences)
  padded = np.zeros((batch, full_length), np.int32)
  for b, seq in enumerate(sequences):
    padded[b, :len(seq)] = seq
  teacher, _, _ = apply(params, jnp.asarray(padded))
  teacher = np.asarray(teacher)

  for b, prompt_length in enumerate(PROMPT_LENGTHS):
    np.testing.assert_allclose(np.asarray(prefill_logits)[b, :prompt_length],
                               teacher[b, :prompt_length], atol=TOL)
    for step in range(STEPS):
      np.testing.assert_allclose(step_logits[step][b], teacher[b, prompt_length + step],
                                 atol=TOL, err_msg=f"row {b}, decode step {step}")
  # The decode must actually depend on the cache: an empty cache gives other logits.
  fresh = model.init_cache(cfg, batch, CACHE_LENGTH, jnp.float32)
  cacheless, _, _ = apply(params, step_inputs[0], positions_BxL=step_inputs[1], cache=fresh)
  assert not np.allclose(np.asarray(cacheless)[:, 0], step_logits[-1], atol=1e-2)
