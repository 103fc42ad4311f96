"""The sampler's truncation rules, greedy one-hot, key derivation and log-probs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.rollout import sampling

LOGITS = jnp.log(jnp.asarray([[0.5, 0.2, 0.15, 0.1, 0.05]] * 4))


def test_top_k_top_p_and_greedy_supports():
  logp = sampling.sampling_logprobs(
      LOGITS, temperature_B=jnp.asarray([1.0, 1.0, 1.0, 0.0]),
      top_k_B=jnp.asarray([0, 2, 0, 0]), top_p_B=jnp.asarray([1.0, 1.0, 0.8, 1.0]))
  probs = np.exp(np.asarray(logp))
  np.testing.assert_allclose(probs[0], [0.5, 0.2, 0.15, 0.1, 0.05], atol=1e-6)
  np.testing.assert_allclose(probs[1], [5 / 7, 2 / 7, 0, 0, 0], atol=1e-6)
  # top_p 0.8: 0.5 + 0.2 < 0.8, so the third (reaching 0.85) is kept, the rest dropped.
  np.testing.assert_allclose(probs[2], np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85, atol=1e-6)
  np.testing.assert_allclose(probs[3], [1, 0, 0, 0, 0])


def test_sample_frequencies_and_logprobs():
  rows = 4000
  logits = jnp.broadcast_to(LOGITS[0], (rows, 5))
  keys = sampling.row_keys(jnp.arange(rows, dtype=jnp.uint32), jnp.zeros(rows, jnp.int32))
  tokens, logprobs = jax.jit(sampling.sample)(
      logits, jnp.full(rows, 2.0), jnp.full(rows, 3, jnp.int32), jnp.ones(rows), keys)
  scaled = np.array([0.5, 0.2, 0.15]) ** 0.5  # temperature 2 then top-3
  freq = np.bincount(np.asarray(tokens), minlength=5) / rows
  np.testing.assert_allclose(freq, np.append(scaled / scaled.sum(), [0, 0]), atol=0.03)
  # Reported log-probs: the distribution sampled from (temperature 2, then top-3
  # renormalised), not the untruncated one.
  np.testing.assert_allclose(logprobs, np.log(scaled / scaled.sum())[np.asarray(tokens)],
                             atol=1e-5)


def test_recorded_logprobs_hand_computed():
  # Row by row: plain; T = 0.5; top-2; top-p 0.6 at T = 1; greedy.
  probs = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
  logits = jnp.log(jnp.asarray([probs] * 5))
  temperature = jnp.asarray([1.0, 0.5, 1.0, 1.0, 0.0])
  top_k = jnp.asarray([0, 0, 2, 0, 0])
  top_p = jnp.asarray([1.0, 1.0, 1.0, 0.6, 1.0])
  tokens = jnp.asarray([2, 1, 1, 0, 0])
  logp = sampling.sampling_logprobs(logits, temperature, top_k, top_p)
  got = np.asarray(sampling.recorded_logprobs(logp, logits, temperature, tokens))
  squared = probs ** 2  # temperature 0.5 squares the probabilities
  expected = [np.log(0.15), np.log(0.04 / squared.sum()), np.log(0.2 / 0.7),
              np.log(0.5 / 0.7),  # 0.5 < 0.6, so 0.2 joins: the nucleus is {0, 1}
              np.log(0.5)]  # greedy reports the model's own log-prob
  np.testing.assert_allclose(got, expected, atol=1e-6)


def test_keys_depend_on_seed_and_position_only():
  a = sampling.row_keys(jnp.asarray([3, 3, 4], jnp.uint32), jnp.asarray([5, 6, 5]))
  b = sampling.row_keys(jnp.asarray([4, 3], jnp.uint32), jnp.asarray([5, 5]))
  data = jax.random.key_data
  np.testing.assert_array_equal(data(a[0]), data(b[1]))
  np.testing.assert_array_equal(data(a[2]), data(b[0]))
  assert not np.array_equal(data(a[0]), data(a[1]))


def _reference_support(logits, temperature, top_k, top_p):
  """The kept set by the textbook rule: stable descending order, top-k, then top-p."""
  x = logits / (temperature if temperature > 0 else 1.0)
  if temperature == 0:
    return np.arange(len(x)) == np.argmax(x)
  order = np.argsort(-x, kind="stable")
  kept = np.ones(len(x), bool) if top_k <= 0 else np.arange(len(x)) < top_k
  p = np.where(kept, np.exp(x[order] - x.max()), 0.0)
  p /= p.sum()
  kept &= (np.cumsum(p) - p < top_p) | (top_p >= 1)
  support = np.zeros(len(x), bool)
  support[order[kept]] = True
  return support


def test_truncation_matches_sorted_reference_with_ties():
  rng = np.random.default_rng(0)
  rows, vocab = 48, 40
  logits = np.round(2 * rng.standard_normal((rows, vocab)), 1).astype(np.float32)  # ties
  temperature = rng.choice([0.0, 0.7, 1.0], rows).astype(np.float32)
  top_k = rng.choice([0, 1, 3, 10, 40], rows).astype(np.int32)
  top_p = rng.choice([1.0, 0.5, 0.9], rows).astype(np.float32)
  logp = np.asarray(sampling.sampling_logprobs(logits, temperature, top_k, top_p))
  for row in range(rows):
    np.testing.assert_array_equal(
        np.isfinite(logp[row]),
        _reference_support(logits[row], temperature[row], top_k[row], top_p[row]))
  # A row's support does not depend on whether another row truncates.
  plain = np.asarray(sampling.sampling_logprobs(logits[:1], np.ones(1, np.float32),
                                                np.zeros(1, np.int32), np.ones(1, np.float32)))
  mixed = np.asarray(sampling.sampling_logprobs(
      logits[:2], np.ones(2, np.float32), np.int32([0, 2]), np.ones(2, np.float32)))
  np.testing.assert_array_equal(plain[0], mixed[0])


def test_draw_never_picks_a_dropped_token():
  logp = jnp.log(jnp.asarray([[0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]]))
  for seed in range(50):
    keys = sampling.row_keys(jnp.asarray([seed, seed], jnp.uint32), jnp.zeros(2, jnp.int32))
    tokens = np.asarray(sampling.draw(logp, keys))
    assert tokens[0] in (1, 3) and tokens[1] == 4


def test_argmax_is_jnp_argmax_with_ties_infinities_and_nans():
  rng = np.random.default_rng(0)
  rows = [rng.integers(0, 3, 50).astype(np.float32),  # many ties of the maximum
          np.full(50, -np.inf, np.float32),  # every token masked
          np.where(np.arange(50) % 7 == 3, np.inf, rng.standard_normal(50)).astype(np.float32),
          np.where(np.arange(50) > 40, np.nan, rng.standard_normal(50)).astype(np.float32),
          np.where(np.arange(50) == 9, np.nan, np.inf).astype(np.float32),
          rng.standard_normal(50).astype(np.float32)]
  x = jnp.asarray(np.stack(rows))
  got = jax.jit(sampling.argmax)(x)
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, jnp.argmax(x, axis=-1))
  np.testing.assert_array_equal(got[:5], [0, 0, 3, 41, 9])


@pytest.mark.parametrize("vocab", [8192, 151936, 129280, 7 * 1024 + 3])
def test_argmax_over_vocabulary_rows_is_jnp_argmax(vocab):
  # Blocks of 256, 128 (Qwen3's 151,936), 256 (DeepSeek-V3's 129,280) and 1 (odd) entries;
  # the maximum tied across blocks and within one, in the last block, and masked rows.
  rng = np.random.default_rng(vocab)
  x = rng.integers(0, 40, (6, vocab)).astype(np.float32)
  x[1] = -np.inf
  x[2, -1] = np.inf
  x[3, [5, 300, vocab - 2]] = 99.0
  x[4, 1000:1003] = 99.0
  got = jax.jit(sampling.argmax)(jnp.asarray(x))
  np.testing.assert_array_equal(got, np.argmax(x, axis=-1))
  assert got[3] == 5 and got[4] == 1000


def test_a_row_with_a_nan_reports_a_nan_logprob():
  # XLA:CPU's long-row max reduction may skip the NaN (the token is then the argmax of the
  # rest); the row's log-prob is NaN either way, so the caller can tell.
  logits = jnp.zeros((2, 8192)).at[0, 17].set(jnp.nan).at[1, 3].set(1.0)
  keys = lambda: sampling.row_keys(jnp.zeros(2, jnp.uint32), jnp.zeros(2, jnp.int32))  # noqa: E731
  tokens, logprobs = jax.jit(lambda x: sampling.sample(
      x, jnp.zeros(2), jnp.zeros(2, jnp.int32), jnp.ones(2), keys))(logits)
  assert np.isnan(logprobs[0]) and tokens[1] == 3 and np.isfinite(logprobs[1])


def test_token_logprobs_are_log_softmax_entries_bit_for_bit():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(8 * rng.standard_normal((6, 300)), jnp.bfloat16)
  tokens = jnp.asarray(rng.integers(0, 300, 6), jnp.int32)
  got = jax.jit(sampling.token_logprobs)(logits, tokens)
  full = jax.jit(lambda x: jax.nn.log_softmax(x.astype(jnp.float32), axis=-1))(logits)
  assert got.dtype == jnp.float32
  np.testing.assert_array_equal(got, np.take_along_axis(np.asarray(full),
                                                        np.asarray(tokens)[:, None], 1)[:, 0])


def test_greedy_and_mixed_batches_sample_as_the_full_distribution_does():
  # sample() skips sampling_logprobs for an all-greedy batch; its tokens and reported
  # log-probs must be those of the one-hot rows of the full rule.
  rng = np.random.default_rng(2)
  logits = jnp.asarray(np.round(3 * rng.standard_normal((5, 64)), 1), jnp.float32)  # ties
  keys = sampling.row_keys(jnp.arange(5, dtype=jnp.uint32), jnp.zeros(5, jnp.int32))
  top_k, top_p = jnp.zeros(5, jnp.int32), jnp.ones(5, jnp.float32)
  for temperature in (jnp.zeros(5), jnp.asarray([0.0, 1.0, 0.0, 0.7, 0.0])):
    tokens, logprobs = jax.jit(sampling.sample)(logits, temperature, top_k, top_p, keys)
    logp = sampling.sampling_logprobs(logits, temperature, top_k, top_p)
    greedy = np.asarray(temperature) == 0
    np.testing.assert_array_equal(np.asarray(tokens)[greedy],
                                  np.argmax(np.asarray(logits), -1)[greedy])
    np.testing.assert_allclose(
        logprobs, sampling.recorded_logprobs(logp, logits, temperature, tokens), rtol=0,
        atol=1e-6)
    model_logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    np.testing.assert_allclose(np.asarray(logprobs)[greedy], np.take_along_axis(
        model_logp, np.asarray(tokens)[:, None], 1)[greedy, 0], rtol=0, atol=1e-6)


def test_sample_without_logprobs_draws_the_same_tokens():
  """logprobs False (a traced flag, as the decode loop passes it) skips the log-probs:
  the same tokens, NaN log-probs; True gives the default's."""
  rng = np.random.default_rng(4)
  logits = jnp.asarray(rng.standard_normal((4, 32)), jnp.float32)
  temperature = jnp.asarray([0.0, 1.0, 0.0, 0.5])
  keys = sampling.row_keys(jnp.arange(4, dtype=jnp.uint32), jnp.zeros(4, jnp.int32))
  args = (logits, temperature, jnp.zeros(4, jnp.int32), jnp.ones(4, jnp.float32), keys)
  flagged = jax.jit(lambda want: sampling.sample(*args, logprobs=want))
  tokens, logprobs = jax.jit(sampling.sample)(*args)
  for want in (False, True):
    got_tokens, got_logprobs = flagged(jnp.bool_(want))
    np.testing.assert_array_equal(got_tokens, tokens)
    if want:  # the same arithmetic, fused differently inside the cond
      np.testing.assert_allclose(got_logprobs, logprobs, rtol=0, atol=1e-6)
    else:
      assert np.isnan(np.asarray(got_logprobs)).all()
