"""Codebase perplexity against brute-force NLL on the tiny model."""

import functools
import math

import jax
import numpy as np
import pytest

from c2jax import model
from c2jax.eval.base import codebase, perplexity


@pytest.fixture(scope="module")
def scorer16(tiny):
  cfg, params = tiny
  return perplexity.WindowScorer(cfg, params, window=16, batch_size=4)


@pytest.fixture(scope="module")
def stream(repo, tok):
  return codebase.tokenize(codebase.collect(repo), tok)


_FORWARDS = {}


def _forward(cfg):
  key = id(cfg)
  if key not in _FORWARDS:
    _FORWARDS[key] = (cfg, jax.jit(functools.partial(model.forward, cfg)))
  return _FORWARDS[key][1]


def _teacher_forced(cfg, params, ids):
  """-log p(x_p | x_<p) for p = 1..N-1, one forward over the whole sequence."""
  logp = jax.nn.log_softmax(_forward(cfg)(params, ids[None]), axis=-1)[0]
  return -np.asarray(logp[np.arange(len(ids) - 1), ids[1:]], np.float64)


def test_collect_filters_and_orders(repo):
  found = codebase.collect(repo)
  assert [f.path for f in found.files] == ["README.md", "a/main.py", "b/util.py"]
  assert found.skipped["vendored"] == 1
  assert found.skipped["extension"] == 2  # logo.png, notes.txt
  assert found.skipped["empty"] == 1
  only_py = codebase.collect(repo, codebase.CodebaseOptions(extensions=(".py",)))
  assert [f.path for f in only_py.files] == ["a/main.py", "b/util.py"]
  binary = codebase.collect(repo, codebase.CodebaseOptions(extensions=(".png", ".py"),
                                                           skip_dirs=()))
  assert binary.skipped["binary"] == 1
  assert "vendor/lib.py" in [f.path for f in binary.files]


def test_documents_layout(repo):
  options = codebase.CodebaseOptions(header="### {path}\n", separator="\n")
  docs = codebase.documents(codebase.collect(repo).files, options)
  assert docs[0] == "### README.md\n# demo\nA tiny repository.\n\n"
  assert docs[-1].startswith("### b/util.py\ndef clamp") and docs[-1].endswith("hi))\n")
  with pytest.raises(ValueError, match="only field is"):
    codebase.collect(repo, codebase.CodebaseOptions(header="{name}\n"))


def test_stream_spans(stream, tok):
  assert stream.ids[0] == tok.bos_id
  assert stream.starts[0] == 1 and stream.ends[-1] == len(stream.ids)
  np.testing.assert_array_equal(stream.starts[1:], stream.ends[:-1])
  assert tok.decode(stream.ids[stream.starts[1]:stream.ends[1]]).startswith("<<< a/main.py >>>")


def test_plan_windows_scores_each_token_once():
  for n, w, s in [(50, 16, 8), (17, 16, 1), (16, 16, 15), (5, 16, 4), (40, 10, 9)]:
    windows = perplexity.plan_windows(n, w, s)
    scored = np.concatenate([np.arange(x.score_from, x.end) for x in windows])
    np.testing.assert_array_equal(scored, np.arange(1, n))
    assert all(x.end - x.begin <= w for x in windows)
    # Every token after the first window sees at least W - S tokens of context.
    assert all(x.score_from - x.begin >= w - s for x in windows[1:])
  with pytest.raises(ValueError, match="stride"):
    perplexity.plan_windows(50, 16, 16)


def test_full_window_equals_teacher_forced(tiny, stream):
  cfg, params = tiny
  ids = stream.ids[:60]
  scorer = perplexity.WindowScorer(cfg, params, window=64, batch_size=1)
  nll, windows = scorer.token_nll(ids, stride=32)
  assert windows == 1
  np.testing.assert_allclose(nll[1:], _teacher_forced(cfg, params, ids), rtol=2e-5, atol=2e-5)


def test_sliding_window_equals_hand_loop(tiny, stream, scorer16):
  cfg, params = tiny
  ids = stream.ids[:70]
  window, stride = 16, 6
  expected = np.zeros(len(ids))
  previous_end = 0
  for begin in range(0, len(ids), stride):  # the usual HF-style loop, written out
    end = min(begin + window, len(ids))
    target_len = end - previous_end
    per_token = _teacher_forced(cfg, params, ids[begin:end])  # predicts begin+1..end-1
    take = min(target_len, end - begin - 1)
    expected[end - take:end] = per_token[len(per_token) - take:]
    previous_end = end
    if end == len(ids):
      break
  nll, _ = scorer16.token_nll(ids, stride)
  np.testing.assert_allclose(nll, expected, rtol=2e-5, atol=2e-5)
  # A longer context changes the numbers: the windows really cut the context.
  assert not np.allclose(nll[1:], _teacher_forced(cfg, params, ids), atol=1e-4)


def test_codebase_perplexity_sums(tiny, tok, repo, scorer16, stream):
  cfg, params = tiny
  result = perplexity.codebase_perplexity(cfg, params, tok, repo, window=16, stride=8,
                                          scorer=scorer16)
  assert result.tokens == len(stream.ids) - 1 == sum(f.tokens for f in result.files)
  assert result.nll == pytest.approx(sum(f.nll for f in result.files), rel=1e-9)
  assert result.bytes == sum(len(d.encode()) for d in codebase.documents(
      codebase.collect(repo).files))
  assert result.perplexity == pytest.approx(math.exp(result.nll / result.tokens))
  assert result.bits_per_byte == pytest.approx(result.nll / math.log(2) / result.bytes)
  # A random model is near-uniform over the 8192-token vocabulary.
  assert 0.5 * math.log(cfg.vocab_size) < result.nll_per_token < 2 * math.log(cfg.vocab_size)
  assert [f.path for f in result.files] == ["README.md", "a/main.py", "b/util.py"]
  assert result.to_json()["per_file"][1]["path"] == "a/main.py"
  with pytest.raises(ValueError, match="vocab_size"):
    scorer16.token_nll(np.array([0, cfg.vocab_size]), 8)
