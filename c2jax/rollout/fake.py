"""FakeEngine: a deterministic stand-in engine for tests of code that drives an engine.

It shares the real scheduler (slots, queueing, stop rules, extend, versions, in-flight
weight swaps) and the real sampler; only the model is replaced by a pure function: the
logits for the token after position p are a fixed pseudo-random vector keyed by
(params, previous token, p), and the experts recorded for a fed token are keyed by
(params, token, position). So the same calls give the same results, `logprobs` agrees
with what `generate` reported, and new params visibly change what is sampled. `params`
is any non-negative int (a stand-in for a weight tree).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from c2jax.rollout import sampling as sampling_lib
from c2jax.rollout.engine import DecodeBatch, Engine, SlotOutput
from c2jax.rollout.types import SamplingParams


class FakeEngine(Engine):

  def __init__(self, *, vocab_size: int = 64, num_slots: int = 4, max_length: int = 512,
               num_moe_layers: int = 2, num_experts: int = 8, experts_per_token: int = 2,
               params: int = 0, version: int = 0,
               detokenize: Callable[[Sequence[int]], str] | None = None, seed: int = 0):
    super().__init__(num_slots, max_length, detokenize, seed)
    self.vocab_size = vocab_size
    self._routing_shape = (num_moe_layers, experts_per_token)
    self._num_experts = num_experts
    self._set_params(params)
    self._version = version
    self._sample = jax.jit(sampling_lib.sample)

  def _set_params(self, params) -> None:
    if not isinstance(params, int) or params < 0:
      raise ValueError(f"FakeEngine params must be a non-negative int salt, got {params!r}.")
    self._salt = params

  def _logits(self, previous: int, position: int) -> np.ndarray:
    rng = np.random.default_rng([self._salt, previous, position])
    return 2.0 * rng.standard_normal(self.vocab_size).astype(np.float32)

  def _routing(self, token: int, position: int) -> np.ndarray:
    rng = np.random.default_rng([self._salt, token, position, 1])
    experts = [rng.choice(self._num_experts, self._routing_shape[1], replace=False)
               for _ in range(self._routing_shape[0])]
    return np.asarray(experts, np.int32).reshape(self._routing_shape)

  def _draw(self, context_last: int, position: int, sampling: SamplingParams, seed: int):
    logits = self._logits(context_last, position)[None]
    keys = sampling_lib.row_keys(np.array([seed], np.uint32), np.array([position]))
    token, logprob = self._sample(logits, np.float32([sampling.temperature]),
                                  np.int32([sampling.top_k]), np.float32([sampling.top_p]),
                                  keys)
    return int(token[0]), float(logprob[0])

  def _append(self, slot, context, start, sampling, seed):
    routing = np.stack([self._routing(t, start + i) for i, t in enumerate(context[start:])])
    token, logprob = self._draw(context[-1], len(context), sampling, seed)
    return token, logprob, routing

  def _decode(self, batch: DecodeBatch) -> dict[int, SlotOutput]:
    outputs = {}
    for slot in np.flatnonzero(batch.active):
      token, position = int(batch.tokens[slot]), int(batch.lengths[slot])
      sampling = SamplingParams(float(batch.temperature[slot]), int(batch.top_k[slot]),
                                float(batch.top_p[slot]))
      new, logprob = self._draw(token, position + 1, sampling, int(batch.seeds[slot]))
      outputs[slot] = SlotOutput(np.int32([new]), np.float32([logprob]),
                                 self._routing(token, position)[None])
    return outputs

  def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
    results = []
    for tokens in sequences:
      values = []
      for p in range(1, len(tokens)):
        logits = self._logits(int(tokens[p - 1]), p).astype(np.float64)
        log_z = np.log(np.sum(np.exp(logits - logits.max()))) + logits.max()
        values.append(logits[int(tokens[p])] - log_z)
      results.append(np.asarray(values, np.float32))
    return results
