"""Speculative decoding as RL actors use it: the log-probs recorded for every sampled token
(accepted drafts and residual draws alike) are the target policy's, exactly what the
learner scores at the same temperature, so speculation never biases importance ratios."""

import jax
import numpy as np

from c2jax.rl.learner import step as learner
from c2jax.rollout import Request, SamplingParams
from tests.rollout.test_jax_engine import prompts

TEMPERATURE = 0.7


LENGTH = 32  # every prompt + generation padded to one length: one compile


def _learner_logprobs(setup, prompt, generation):
  """The RL learner's log pi_T of the generated tokens, replaying the engine's routes."""
  tokens = np.concatenate([prompt, generation.tokens]).astype(np.int32)
  n = len(tokens)
  routes = np.asarray(generation.expert_indices)[:n]
  batch = dict(tokens=np.zeros((1, LENGTH), np.int32), valid=np.zeros((1, LENGTH), np.int32),
               router_indices=np.zeros((1, LENGTH, *routes.shape[1:]), np.int32))
  batch["tokens"][0, :n], batch["valid"][0, :n], batch["router_indices"][0, :n] = (
      tokens, 1, routes)
  if "score" not in _JITTED:
    _JITTED["score"] = jax.jit(lambda p, b: learner.token_logprobs(
        setup.cfg, p, b, TEMPERATURE)[0])
  logprobs = _JITTED["score"](setup.params, batch)
  return np.asarray(logprobs[0, len(prompt):n])


_JITTED = {}


def test_recorded_logprobs_are_the_policys_at_the_sampling_temperature(setup, spec_engine):
  before = (spec_engine.acceptance.steps, spec_engine.acceptance.accepted)
  requests = [Request(p, SamplingParams(temperature=TEMPERATURE, max_tokens=10, seed=s))
              for s, p in enumerate(prompts() * 2)]
  generations = spec_engine.generate(requests)
  for request, generation in zip(requests, generations):
    assert len(generation.tokens) == 10
    np.testing.assert_allclose(generation.logprobs,
                               _learner_logprobs(setup, request.tokens, generation),
                               atol=2e-5)
  # Multi-token steps happened (accepted drafts) and so did rejections (residual draws).
  steps = spec_engine.acceptance.steps - before[0]
  accepted = spec_engine.acceptance.accepted - before[1]
  assert 0 < accepted < 2 * steps, (accepted, steps)
