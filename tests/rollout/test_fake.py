"""FakeEngine: deterministic, self-consistent, and faithful to the Engine contract."""

import numpy as np
import pytest

from c2jax.rollout import FakeEngine, Request, SamplingParams


def make(**kw):
  return FakeEngine(vocab_size=16, num_slots=2, max_length=64,
                    detokenize=lambda ids: "".join(chr(97 + i) for i in ids), **kw)


def test_deterministic_and_logprobs_consistent():
  requests = [Request([1, 2, 3], SamplingParams(max_tokens=6, seed=s)) for s in range(3)]
  first, second = make().generate(requests), make().generate(requests)
  engine = make()
  for a, b in zip(first, second):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.expert_indices.shape == (3 + 6, 2, 2)
    [scored] = engine.logprobs([np.concatenate([[1, 2, 3], a.tokens])])
    np.testing.assert_allclose(scored[2:], a.logprobs, atol=1e-5)
  assert len({tuple(g.tokens) for g in first}) > 1  # seeds matter


def test_stops_extend_and_versions():
  engine = make()
  reference = engine.generate([Request([5], SamplingParams(temperature=0, max_tokens=8))])[0]
  stop = int(reference.tokens[2])
  cut = reference.tokens[:list(reference.tokens).index(stop) + 1]
  stopped = engine.generate([Request([5], SamplingParams(
      temperature=0, stop_tokens=(stop,)), keep_alive=True)])[0]
  np.testing.assert_array_equal(stopped.tokens, cut)
  assert stopped.finish_reason == "stop_token"
  engine.update_params(1, version=3)
  extended = engine.extend(stopped.seq_id, [7, 7], SamplingParams(temperature=0, max_tokens=3))
  np.testing.assert_array_equal(extended.versions, [3, 3, 3])
  assert engine.version == 3
  with pytest.raises(ValueError, match="non-negative int"):
    engine.update_params("weights", 4)
    engine.step()


def test_cancel_frees_the_slot_and_progress_shows_tokens_so_far():
  engine = make()
  sampling = SamplingParams(temperature=0, max_tokens=20)
  running = [engine.submit(Request([1, 2], sampling)) for _ in range(2)]
  queued = engine.submit(Request([3], sampling))
  engine.step()
  engine.step()
  tokens, logprobs = engine.progress(running[0])
  assert len(tokens) == len(logprobs) == 3  # one from prefill, one per decode step
  assert engine.progress(queued) == ([], [])  # both slots taken, still queued
  engine.cancel(running[0])
  engine.cancel(queued)
  with pytest.raises(ValueError, match="unknown"):
    engine.cancel(queued)
  # The freed slot takes a new request; its result equals a fresh engine's.
  later = engine.submit(Request([4], sampling))
  results = {}
  while engine.busy:
    results.update((g.seq_id, g) for g in engine.step())
  assert set(results) == {running[1], later}
  [alone] = make().generate([Request([4], sampling)])
  np.testing.assert_array_equal(results[later].tokens, alone.tokens)
