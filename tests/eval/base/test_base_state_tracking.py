"""State tracking: cases from git histories and procedures, answer extraction, scoring
through real engines (a scripted oracle engine, FakeEngine, JaxEngine on the tiny model)."""

import json
import pathlib
import shutil
import subprocess
import sys

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from c2jax.eval.base import diffs, state_cases, state_tracking
from c2jax.rollout import FakeEngine, JaxEngine
from c2jax.rollout.engine import Engine, SlotOutput

def _replay(case):
  text = case.initial
  for patch in case.diffs:
    text = diffs.apply(text, patch)
  return text


@pytest.fixture(scope="module")
def small_cases():
  return state_cases.procedural_cases(3, seed=7, num_diffs=(1, 2), num_functions=(1, 1),
                                      edits_per_diff=(1, 1))


def test_procedural_cases_are_deterministic_and_consistent():
  first = state_cases.procedural_cases(6, seed=3)
  again = state_cases.procedural_cases(6, seed=3)
  other = state_cases.procedural_cases(6, seed=4)
  assert [c.to_json() for c in first] == [c.to_json() for c in again]
  assert [c.final for c in first] != [c.final for c in other]
  for case in first:
    assert 2 <= len(case.diffs) <= 6
    assert _replay(case) == case.final != case.initial


def _commit(repo, message):
  subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
  subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                  "commit", "-qm", message], check=True)


@pytest.fixture(scope="module")
def history_repo(tmp_path_factory):
  """m.py: 4 versions, then renamed to renamed.py and edited once more."""
  if shutil.which("git") is None:
    pytest.skip("needs git")
  repo = tmp_path_factory.mktemp("history") / "proj"
  repo.mkdir()
  subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True)
  for i, text in enumerate(VERSIONS):
    (repo / "m.py").write_text(text)
    (repo / "other.py").write_text(f"x = {i % 2}\n")
    _commit(repo, f"v{i}")
  subprocess.run(["git", "-C", str(repo), "mv", "m.py", "renamed.py"], check=True)
  _commit(repo, "rename")
  (repo / "renamed.py").write_text("a = 10\nc = 3\n")
  _commit(repo, "after rename")
  return repo


VERSIONS = ["a = 1\n", "a = 1\nb = 2\n", "a = 10\nb = 2\n", "a = 10\nb = 2\nc = 3"]


def test_git_cases_follow_renames_and_match_git(history_repo, tmp_path):
  repo, versions = history_repo, VERSIONS
  stats = {}
  cases = state_cases.git_cases(repo, min_diffs=2, max_diffs=10, stats=stats)
  by_path = {c.path: c for c in cases}
  case = by_path["renamed.py"]
  assert case.initial == "a = 1\n" and case.final == "a = 10\nc = 3\n"
  assert len(case.diffs) == 5  # 3 edits, the rename, the edit after it
  assert _replay(case) == case.final
  assert case.meta["paths"][0] == "m.py" and case.id.startswith("git:proj:renamed.py@")
  short = state_cases.git_cases(repo, min_diffs=2, max_diffs=2)
  assert [c.final for c in short if c.path == "m.py"] == [versions[2]]
  out = tmp_path / "cases.jsonl"
  state_cases.save_jsonl(cases, out)
  assert [c.to_json() for c in state_cases.load_jsonl(out)] == [c.to_json() for c in cases]
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({**cases[0].to_json(), "diffs": "not a list"}) + "\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:1: .*\['diffs'\]"):
    state_cases.load_jsonl(bad)


def test_build_tool_writes_cases(history_repo, tmp_path):
  out = tmp_path / "cases.jsonl"
  repo = pathlib.Path(__file__).resolve().parents[3]
  done = subprocess.run([sys.executable, "-m", "tools.tasks.build_state_tracking", "--repo",
                         str(history_repo), "--out", str(out), "--procedural", "2", "--seed",
                         "5"], cwd=repo, check=True, capture_output=True, text=True)
  assert json.loads(done.stdout)["cases"] == 4
  cases = state_cases.load_jsonl(out)
  assert [c.source for c in cases] == ["git", "git", "procedural", "procedural"]
  assert all(_replay(c) == c.final for c in cases)
  failed = subprocess.run([sys.executable, "-m", "tools.tasks.build_state_tracking", "--out",
                           str(out)], cwd=repo, capture_output=True, text=True)
  assert failed.returncode != 0 and "--procedural" in failed.stderr


def test_extract_answer_never_raises():
  assert state_tracking.extract_answer("x = 1\ny\n```\ntrailing") == "x = 1\ny\n"
  assert state_tracking.extract_answer("x = 1\ny") == "x = 1\ny"  # never closed
  assert state_tracking.extract_answer("```") == ""
  assert state_tracking.extract_answer("") == ""
  assert state_tracking.extract_answer("Sure:\n```python\nz = 2\n```\n", opened=False) == "z = 2\n"
  assert state_tracking.extract_answer("no fence", opened=False) == "no fence"
  assert state_tracking.extract_answer("```\nunclosed", opened=False) == "unclosed"
  for junk in ["\x00\ud800```", "```\n```\n```", "\n" * 5, None, 3]:
    assert isinstance(state_tracking.extract_answer(junk), str)
    assert isinstance(state_tracking.extract_answer(junk, opened=False), str)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["`", "\n", "a", " ", "python", "\r"]), max_size=40).map(
    "".join), st.booleans())
def test_extract_answer_fuzz(text, opened):
  answer = state_tracking.extract_answer(text, opened)
  assert isinstance(answer, str) and len(answer) <= len(text) + 1


def test_oracle_scores_one_and_wrong_answers_less(small_cases):
  for case in small_cases:
    oracle = state_tracking.extract_answer(case.final + "```\n")
    assert state_tracking.score_answer(oracle, case.final) == 1.0
    assert state_tracking.score_answer(case.initial, case.final) < 1.0
    assert state_tracking.score_answer(case.final[:-2], case.final) < 1.0


def test_prompt_format_is_configurable(small_cases):
  case = small_cases[0]
  prompt = state_tracking.render_prompt(case)
  assert prompt.endswith(f"Final content of {case.path}:\n```\n")
  assert case.initial in prompt and all(d in prompt for d in case.diffs)
  custom = state_tracking.StateTrackingOptions(
      template="{path}|{num_diffs}|{initial}|{diffs}>>>", diff_template="#{index}\n{diff}")
  text = state_tracking.render_prompt(case, custom)
  assert text.startswith(f"{case.path}|{len(case.diffs)}|") and text.endswith(">>>")
  assert not custom.opens_block
  with pytest.raises(ValueError, match="fields may only be"):
    state_tracking.StateTrackingOptions(template="{file}").validate()


class OracleEngine(Engine):
  """Writes each prompt's scripted completion through the real scheduler."""

  def __init__(self, scripts: dict, **kwargs):
    super().__init__(**kwargs)
    self._scripts, self._plans = scripts, {}

  def _append(self, slot, context, start, sampling, seed):
    script = self._scripts[tuple(context)]
    self._plans[slot] = (script, len(context))
    return script[0], 0.0, np.zeros((len(context) - start, 1, 1), np.int32)

  def _decode(self, batch):
    outputs = {}
    for slot in np.flatnonzero(batch.active):
      script, prompt_len = self._plans[slot]
      index = int(batch.lengths[slot]) - prompt_len + 1
      token = script[index] if index < len(script) else script[-1]
      outputs[slot] = SlotOutput(np.int32([token]), np.float32([0.0]),
                                 np.zeros((1, 1, 1), np.int32))
    return outputs

  def _set_params(self, params):
    pass

  def logprobs(self, sequences):
    return [np.zeros(len(s) - 1, np.float32) for s in sequences]


def _prompt_ids(tok, case):
  return (tok.bos_id, *tok.encode(state_tracking.render_prompt(case)).tolist())


def test_run_with_oracle_engine_scores_one(tok, small_cases):
  scripts = {}
  for i, case in enumerate(small_cases):
    answer = case.final if i else case.final.split("\n", 1)[1]  # first line missing
    scripts[_prompt_ids(tok, case)] = tok.encode(answer + "```\nmore text").tolist()
  engine = OracleEngine(scripts, num_slots=2, max_length=2048, detokenize=tok.decode)
  result = state_tracking.run(engine, tok, small_cases)
  scores = [c.score for c in result.cases]
  assert scores[1:] == [1.0, 1.0] and 0.8 < scores[0] < 1.0
  assert result.exact_match == pytest.approx(2 / 3)
  assert all(c.finish_reason == "stop_string" for c in result.cases)
  assert result.summary()["cases"] == 3
  buckets = result.by_prompt_length()
  assert sum(b["cases"] for b in buckets.values()) == 3
  for label, bucket in buckets.items():
    inside = [c for c in result.cases
              if int(label[2:]) // 2 < c.prompt_tokens <= int(label[2:])]
    assert bucket["mean_score"] == pytest.approx(np.mean([c.score for c in inside]))


def test_run_with_fake_engine_is_deterministic(tok, small_cases):
  make = lambda: FakeEngine(vocab_size=300, num_slots=2, max_length=2048,
                            detokenize=tok.decode)
  options = state_tracking.StateTrackingOptions(max_new_tokens_factor=0.2)
  first = state_tracking.run(make(), tok, small_cases, options)
  second = state_tracking.run(make(), tok, small_cases, options)
  assert first.to_json()["per_case"] == second.to_json()["per_case"]
  assert all(0.0 <= c.score < 1.0 for c in first.cases)
  [huge] = state_cases.procedural_cases(1, seed=9, num_functions=(40, 40))
  mixed = state_tracking.run(make(), tok, [small_cases[0], huge], options)
  assert mixed.skipped == (huge.id,) and [c.id for c in mixed.cases] == [small_cases[0].id]
  too_small = FakeEngine(vocab_size=300, num_slots=2, max_length=64, detokenize=tok.decode)
  with pytest.raises(ValueError, match="max_length"):
    state_tracking.run(too_small, tok, small_cases)


def test_run_with_jax_engine_tiny(tiny, tok, small_cases):
  cfg, params = tiny
  engine = JaxEngine(cfg, params, num_slots=3, max_length=1024, detokenize=tok.decode,
                     prefill_buckets=(512, 1024))
  options = state_tracking.StateTrackingOptions(max_new_tokens_factor=0.1,
                                                max_new_tokens_slack=4)
  result = state_tracking.run(engine, tok, small_cases, options)
  assert len(result.cases) == 3 and not result.skipped
  assert all(0.0 <= c.score < 1.0 for c in result.cases)
  assert all(c.completion_tokens >= 1 for c in result.cases)
