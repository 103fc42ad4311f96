"""The scripted oracle scores 100% on every suite that declares an oracle, through the
real runner, sandboxes and graders; and the targeted graders do fail what they must."""

import ml_collections
import pytest

from c2jax.env import bubblewrap
from c2jax.env import reward as reward_lib
from c2jax.eval import checks, episode, oracle, runner, suites, targeted
from eval_testlib import (sdist_fixture, swebench_fixture, swebench_git_fixture,
                          task_folders_fixture)


def _suite_args(name, tmp_path):
  args = suites.get_suite(name.removesuffix("_git")).defaults()
  if name in ("procgen", "eager_editing", "instruction_following"):
    args.count = 6
  if name == "procgen":
    args.difficulties = (0, 1, 2, 3, 4)
  if name == "swebench":
    args.path, args.repos_root = swebench_fixture(str(tmp_path / "swe"))
  if name == "swebench_git":
    args.path, args.repo_dir = swebench_git_fixture(str(tmp_path / "swe"))
  if name == "terminal_bench":
    args.path = task_folders_fixture(tmp_path / "tb")
  if name == "revert_restore":
    cache = str(tmp_path / "sdists")
    sdist_fixture(cache)
    args.packages, args.cache_dir, args.tasks_per_package = ("minipkg==1.0",), cache, 2
  return args


ORACLE_SUITES = ("procgen", "revert_restore", "swebench", "terminal_bench",
                 "eager_editing", "instruction_following")


def test_every_oracle_suite_is_covered_here():
  # Scored suites with an oracle (state_tracking) are run by test_eval_base_suites.py.
  declared = {s for s in suites.suite_names()
              if suites.get_suite(s).oracle and suites.get_suite(s).kind == "agent"}
  assert declared == set(ORACLE_SUITES), "add the new oracle suite to ORACLE_SUITES"


@pytest.mark.parametrize("name", ORACLE_SUITES + ("swebench_git",))
def test_oracle_scores_100_percent(name, tmp_path):
  suite = suites.get_suite(name.removesuffix("_git"))
  tasks = suites.build_tasks(suite, _suite_args(name, tmp_path), str(tmp_path / "tasks"))
  assert tasks
  policy = oracle.OraclePolicy("bubblewrap", concurrency=2)
  summary = runner.evaluate_tasks(policy, tasks, tmp_path / "run", samples=1,
                                  suite_name=name, progress=False)
  overall = summary["overall"]
  failed = {t: m for t, m in summary["per_task"].items() if m["accuracy"] != 1.0}
  assert overall["infra_errors"] == 0, overall
  assert overall["accuracy"] == 1.0 and not failed, failed
  assert overall["episodes"] == len(tasks)
  assert overall["tool_calls"]["mean"] >= 2  # it went through the tools


def test_suites_are_deterministic_by_seed(tmp_path):
  a = targeted.eager_suite(str(tmp_path / "a"), 4, seed=3)
  b = targeted.eager_suite(str(tmp_path / "b"), 4, seed=3)
  assert [t.prompt for t in a] == [t.prompt for t in b]
  assert [t.metadata["answer"] for t in a] == [t.metadata["answer"] for t in b]
  c = targeted.instruction_suite(str(tmp_path / "c"), 4, seed=3)
  d = targeted.instruction_suite(str(tmp_path / "d"), 4, seed=3)
  assert [t.prompt for t in c] == [t.prompt for t in d]


def test_eager_editing_fails_any_edit(tmp_path):
  task = targeted.eager_task(str(tmp_path), seed=1)
  path = task.metadata["question"].get("module", "pkg.x").replace(".", "/") + ".py"
  with bubblewrap.BubblewrapSandbox(task.repo) as box:
    passed, _ = reward_lib.run_hidden_tests(box, task)
    assert passed == {checks.WORKSPACE_TEST: True}
    box.run_shell("python -c 'import pkg'")  # caches are not edits
    assert reward_lib.run_hidden_tests(box, task)[0][checks.WORKSPACE_TEST]
    box.write_file("notes.txt", b"I was here\n")  # a new file is an edit too
    assert not reward_lib.run_hidden_tests(box, task)[0][checks.WORKSPACE_TEST]
  with bubblewrap.BubblewrapSandbox(task.repo) as box:
    target = next(p for p in box.list_files() if p.endswith(".py") and p != "pkg/__init__.py")
    box.write_file(target, box.read_file(target) + b"\n# tidy\n")
    output = reward_lib.run_hidden_tests(box, task)
    assert not output[0][checks.WORKSPACE_TEST] and target in output[1], path


def _outcome(answer, tools=("finish",)):
  calls = [{"id": f"c{i}", "type": "function",
            "function": {"name": n, "arguments": '{"message": "%s"}' % answer
                         if n == "finish" else "{}"}} for i, n in enumerate(tools)]
  return episode.Outcome(passed={}, finish_reason="finish", turns=1, tool_calls=len(calls),
                         wall_s=0.0, messages=[{"role": "assistant", "content": "",
                                                "tool_calls": calls}])


def test_transcript_checks_fail_broken_constraints():
  task = ml_collections.ConfigDict()  # only .metadata is read
  task.metadata = {"checks": [{"id": "no_shell", "kind": "no_tool", "tool": "run_shell"},
                              {"id": "short", "kind": "max_words", "n": 3},
                              {"id": "prefix", "kind": "answer_starts_with", "prefix": "DONE:"},
                              {"id": "answer", "kind": "answer_contains", "text": "12"}]}
  good = checks.apply_checks(task, _outcome("DONE: 12"))
  assert all(good.values()) and set(good) == {f"check::{n}" for n in
                                              ("no_shell", "short", "prefix", "answer")}
  bad = checks.apply_checks(task, _outcome("It returns 123 now", ("run_shell", "finish")))
  assert not any(bad.values()), bad
