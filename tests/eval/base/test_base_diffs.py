"""Unified diffs round-trip (also against git's own output) and the edit distance is exact."""

import shutil
import subprocess

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from c2jax.eval.base import diffs, levenshtein

_LINES = st.lists(st.sampled_from(["a", "b", "", "  x = 1", "\r", "c\x0cd", "end"]),
                  max_size=12)


def _text(lines, final_newline):
  text = "\n".join(lines)
  return text + "\n" if (final_newline and lines) else text


@settings(max_examples=150, deadline=None)
@given(_LINES, _LINES, st.booleans(), st.booleans(), st.integers(0, 3))
def test_make_then_apply_round_trips(old, new, old_nl, new_nl, context):
  old_text, new_text = _text(old, old_nl), _text(new, new_nl)
  patch = diffs.make(old_text, new_text, "f.py", context)
  assert diffs.apply(old_text, patch) == new_text
  assert (patch == "") == (old_text == new_text)


def test_apply_rejects_a_diff_that_does_not_fit():
  patch = diffs.make("a\nb\nc\n", "a\nB\nc\n", "f")
  with pytest.raises(diffs.DiffError, match="should be 'b'"):
    diffs.apply("a\nX\nc\n", patch)
  with pytest.raises(diffs.DiffError, match="truncated"):
    diffs.apply("a\nb\nc\n", patch.rsplit("\n", 3)[0])


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_apply_reads_git_diffs(tmp_path):
  versions = ["def f():\n  return 1\n", "def f():\n  return 2\n\n\ndef g():\n  pass",
              "# header\ndef g():\n  pass\n", ""]
  run = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True,
                                  capture_output=True, text=True).stdout
  run("init", "-q")
  for i, text in enumerate(versions):
    (tmp_path / "m.py").write_text(text)
    run("add", "m.py")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"v{i}",
        "--allow-empty")
  for i in range(len(versions) - 1):
    patch = run("diff", f"HEAD~{len(versions) - 1 - i}", f"HEAD~{len(versions) - 2 - i}")
    assert diffs.apply(versions[i], patch) == versions[i + 1]


def _reference_distance(a, b):
  row = list(range(len(b) + 1))
  for i, ca in enumerate(a, 1):
    previous, row[0] = row[0], i
    for j, cb in enumerate(b, 1):
      previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
  return row[-1]


@settings(max_examples=300, deadline=None)
@given(st.text("abc\n", max_size=40), st.text("abcd\n", max_size=90))
def test_distance_matches_dynamic_programming(a, b):
  assert levenshtein.distance(a, b) == _reference_distance(a, b)
  assert levenshtein.distance(b, a) == levenshtein.distance(a, b)


def test_similarity():
  assert levenshtein.similarity("", "") == 1.0
  assert levenshtein.similarity("abc", "abc") == 1.0
  assert levenshtein.similarity("abc", "") == 0.0
  assert levenshtein.similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)
  long = "x = 1\n" * 3000
  assert levenshtein.similarity(long, long[:-6]) == pytest.approx(1 - 6 / len(long))
