"""Speculative decoding with the MTP drafter: exactly greedy at temperature 0, and the
accept/reject rule leaves the sampled distribution unchanged."""

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.rollout import Request, SamplingParams, speculative
from tests.rollout.test_jax_engine import GREEDY, check_against_teacher, prompts


def test_greedy_speculation_equals_plain_greedy(setup, engine, spec_engine):
  requests = [Request(p, GREEDY) for p in prompts()]
  plain = engine.generate(requests)
  before = spec_engine.acceptance.accepted
  spec = spec_engine.generate(requests)
  for request, p, s in zip(requests, plain, spec):
    np.testing.assert_array_equal(s.tokens, p.tokens)
    np.testing.assert_array_equal(s.expert_indices, p.expert_indices)
    check_against_teacher(setup, setup.params, request.tokens, s)
  # Some drafts were accepted, so multi-token steps were exercised.
  assert spec_engine.acceptance.accepted > before


def test_speculative_extend(setup, spec_engine):
  prompt, observation = prompts()[1], np.array([2, 7, 1, 8], np.int32)
  first = spec_engine.generate([Request(prompt, GREEDY, keep_alive=True)])[0]
  second = spec_engine.extend(first.seq_id, observation, GREEDY, keep_alive=False)
  history = np.concatenate([prompt, first.tokens, observation])
  check_against_teacher(setup, setup.params, history, second)


def test_accept_rule_preserves_the_target_distribution():
  """First emitted token of a step (draft kept, or residual draw) ~ target p exactly."""
  vocab, samples, num_draft = 5, 40000, 2
  rng = np.random.default_rng(0)
  target_logp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((1, num_draft + 1, vocab))))
  draft_logp = jax.nn.log_softmax(jnp.asarray(2 * rng.standard_normal((1, num_draft, vocab))))
  keys = jax.random.split(jax.random.key(0), (4, samples))
  drafts = jax.vmap(lambda k: jax.random.categorical(k, draft_logp[0]))(keys[0])

  def one(draft, k1, k2):
    accepted, nxt = speculative.accept(target_logp, draft_logp, draft[None], k1[None],
                                       k2[None])
    return accepted[0], jnp.where(accepted[0] > 0, draft[0], nxt[0])

  accepted, first = jax.jit(jax.vmap(one))(drafts, keys[1], keys[2])
  freq = np.bincount(np.asarray(first), minlength=vocab) / samples
  p = np.exp(np.asarray(target_logp[0, 0]))
  assert np.abs(freq - p).sum() / 2 < 0.01, (freq, p)
  # Not a degenerate pass: drafts are both accepted and rejected.
  assert 0.2 < np.mean(np.asarray(accepted) > 0) < 0.9


def test_sampled_speculation_matches_model_distribution(setup, spec_engine):
  """Marginals of the 2nd and 3rd sampled tokens (drawn by the accept rule) against the
  exact ones from teacher-forced forwards over every continuation."""
  prompt = prompts()[0]
  count = 300
  sampling = [SamplingParams(temperature=1.0, max_tokens=3, seed=s) for s in range(count)]
  tokens = np.stack([g.tokens for g in spec_engine.generate(
      [Request(prompt, s) for s in sampling])])
  vocab = setup.cfg.vocab_size
  p1 = np.exp(setup.teacher(setup.params, prompt)[0][-1])
  p2 = np.zeros(vocab)
  p3 = np.zeros(vocab)
  for a in range(vocab):
    logp = setup.teacher(setup.params, np.append(prompt, a))[0][-1]
    p2 += p1[a] * np.exp(logp)
    for b in range(vocab):
      joint = p1[a] * np.exp(logp[b])
      p3 += joint * np.exp(setup.teacher(setup.params, np.append(prompt, [a, b]))[0][-1])
  for column, expected in ((1, p2), (2, p3)):
    observed = np.bincount(tokens[:, column], minlength=vocab)
    chi2 = np.sum((observed - count * expected) ** 2 / (count * expected))
    # 15 degrees of freedom: chi2 > 37.7 has probability 0.001 under the null.
    assert chi2 < 37.7, (column, observed, count * expected)
