"""Multi-step decode calls sample exactly what one-step calls sample, a stop inside a chunk
ends the sequence exactly there, and a call runs max_decode_steps tokens unless a running
request has stop strings (decode_steps then)."""

import dataclasses

import numpy as np
import pytest

from c2jax.rollout import Request, SamplingParams
from tests.rollout.conftest import VOCAB, detokenize


@pytest.fixture(scope="module")
def engines(setup):
  return (setup.engine(decode_steps=1, max_decode_steps=1),
          setup.engine(decode_steps=4, max_decode_steps=16))


def _requests(stop_token: int, stop_string: str):
  rng = np.random.default_rng(3)
  prompts = [rng.integers(0, VOCAB, n).astype(np.int32) for n in (5, 9, 4, 7)]
  settings = [
      SamplingParams(temperature=1.0, max_tokens=11, seed=5),  # max_tokens mid-chunk
      SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_tokens=14, seed=6),
      SamplingParams(temperature=0.0, max_tokens=30, stop_tokens=(stop_token,)),
      SamplingParams(temperature=1.0, max_tokens=30, seed=7, stop_strings=(stop_string,)),
  ]
  # Four requests on two slots: two queue and join when the first ones leave.
  return [Request(p, s) for p, s in zip(prompts, settings)]


def test_one_and_four_steps_per_call_sample_the_same(engines):
  one, four = engines
  probe = one.generate([Request(np.int32([1, 2, 3, 4]), SamplingParams(
      temperature=0.0, max_tokens=12))])[0].tokens
  # A stop token the greedy request meets after a few tokens (not at a chunk boundary
  # for most of the stops below), and a two-letter stop string.
  requests = _requests(int(probe[5]), detokenize(probe[2:4]))
  by_one, by_four = one.generate(requests), four.generate(requests)
  for a, b in zip(by_one, by_four):
    assert a.finish_reason == b.finish_reason
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    np.testing.assert_array_equal(a.expert_indices, b.expert_indices)
    assert len(a.expert_indices) == len(a.prompt_tokens) + len(a.tokens)
  assert [g.finish_reason for g in by_four][:2] == ["max_tokens", "max_tokens"]
  assert [len(g.tokens) for g in by_four][:2] == [11, 14]


def test_stop_token_inside_a_chunk_ends_there(engines):
  _, four = engines
  prompt = np.int32([2, 7, 1, 8])
  reference = four.generate([Request(prompt, SamplingParams(temperature=0.0,
                                                            max_tokens=12))])[0].tokens
  # The first token not seen before, at index >= 2: its chunk (prefill samples token 0,
  # each call samples four) does not end there.
  stop_at = next(i for i in range(2, 12) if reference[i] not in reference[:i]
                 and (i - 1) % 4 != 3)
  stopped = four.generate([Request(prompt, SamplingParams(
      temperature=0.0, max_tokens=12, stop_tokens=(int(reference[stop_at]),),
      ))])[0]
  assert stopped.finish_reason == "stop_token"
  np.testing.assert_array_equal(stopped.tokens, reference[:stop_at + 1])
  assert len(stopped.expert_indices) == len(prompt) + stop_at + 1
  # The slot is free and clean: the next request matches a fresh run.
  again = four.generate([Request(prompt, SamplingParams(temperature=0.0, max_tokens=12))])
  np.testing.assert_array_equal(again[0].tokens, reference)


@pytest.mark.parametrize("stop_strings,per_call", [((), 16), (("zzzz",), 4)])
def test_a_call_is_long_unless_the_host_must_check_stop_strings(engines, stop_strings,
                                                                per_call):
  _, four = engines
  seq_id = four.submit(Request(np.int32([3, 1, 4]), SamplingParams(
      temperature=0.0, max_tokens=30, stop_strings=stop_strings)))
  assert not four.step()  # the prefill samples 1 token, the decode call per_call more
  assert len(four.progress(seq_id)[0]) == 1 + per_call
  four.cancel(seq_id)


def test_decode_steps_must_be_positive_and_one_when_speculating(setup):
  with pytest.raises(ValueError, match="decode_steps"):
    setup.engine(decode_steps=0)
  with pytest.raises(ValueError, match="max_decode_steps"):
    setup.engine(decode_steps=8, max_decode_steps=4)
  with pytest.raises(ValueError, match="speculating"):
    setup.engine(decode_steps=4, num_draft_tokens=2)


def test_requests_without_logprobs_sample_the_same_tokens(engines, monkeypatch):
  """SamplingParams.logprobs False: the same tokens and routing, NaN log-probs for those
  requests only; a call where no running request wants log-probs skips them on device
  (its log-probs come back NaN) and still samples the same tokens."""
  _, four = engines
  requests = _requests(stop_token=-1, stop_string="\x00")
  reference = four.generate(requests)
  wants = [True, False, False, True]
  mixed = four.generate([Request(r.tokens, dataclasses.replace(r.sampling, logprobs=w))
                         for r, w in zip(requests, wants)])
  device_logprobs = []  # what each decode call's device loop returned, active slots
  real = four._decode_fn

  def recording(params, cache, tokens, lengths, active, *rest):
    out = real(params, cache, tokens, lengths, active, *rest)
    fed = np.asarray(out[3])
    device_logprobs.extend(np.asarray(out[2])[s, :fed[s]] for s in np.flatnonzero(active))
    return out
  monkeypatch.setattr(four, "_decode_fn", recording)
  none = four.generate([Request(r.tokens, dataclasses.replace(r.sampling, logprobs=False))
                        for r in requests[1:3]])
  assert device_logprobs and all(np.isnan(x).all() for x in device_logprobs)
  for ref, got, want in zip(reference, mixed, wants):
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_array_equal(got.expert_indices, ref.expert_indices)
    if want:
      np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-6)
    else:
      assert np.isnan(got.logprobs).all()
  for ref, got in zip(reference[1:3], none):
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    assert np.isnan(got.logprobs).all()
