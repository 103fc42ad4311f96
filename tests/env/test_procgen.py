"""Procedural tasks: bugs are real, and the scripted solver solves every one of them
through the tool protocol, leaving valid SFT traces."""

import json
import os
import subprocess
import sys

import pytest

from c2jax.agent import solver
from c2jax.env import procgen, reward
from c2jax.env import tasks as tasks_lib
from c2jax.env import tools as tools_lib
from c2jax.env.bubblewrap import BubblewrapSandbox
from experiments.findings import eval_agent_sft
from tools.tasks import build_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_generation_is_deterministic_and_graded(tmp_path):
  a = procgen.generate_suite(str(tmp_path / 'a'), 8, seed=3)
  b = procgen.generate_suite(str(tmp_path / 'b'), 8, seed=3)
  assert [t.hidden_files for t in a] == [t.hidden_files for t in b]
  assert [t.metadata['difficulty'] for t in a] == [1, 2, 3, 4] * 2
  assert {t.metadata['category'] for t in a} == {
      procgen.CATEGORIES[d] for d in procgen.DEFAULT_DIFFICULTIES}
  multi = [t for t in a if t.metadata['difficulty'] == 3][0]
  assert len({path for path, _, _ in multi.metadata['solution']}) == 2
  for task in a:  # hidden tests are not in the repository
    assert not os.path.exists(os.path.join(task.repo, 'tests'))
  with pytest.raises(ValueError, match='difficulty must be one of'):
    procgen.generate(str(tmp_path), 0, 7)


def test_constant_tasks_state_their_fix_and_test_the_constant(tmp_path):
  suite = procgen.generate_suite(str(tmp_path), 6, seed=40, difficulties=(0,))
  assert [t.metadata['category'] for t in suite] == ['constant'] * 6
  assert len({t.prompt for t in suite}) == 6
  for task in suite:
    ((path, old, new),) = task.metadata['solution']
    name, bad = old.rstrip('\n').split(' = ')
    good = new.rstrip('\n').split(' = ')[1]
    assert bad != good
    assert task.prompt == f'In {path}, {name} is {bad} but it should be {good}. Fix it.'
    with open(os.path.join(task.repo, path)) as f:
      assert f.read().count(old) == 1
    # Every case reads the constant, so every hidden test fails until it is fixed.
    assert len(task.fail_to_pass) == 4 and not task.pass_to_pass
  mixed = procgen.generate_suite(str(tmp_path / 'mixed'), 4, seed=2, difficulties=(0, 3))
  assert [t.metadata['difficulty'] for t in mixed] == [0, 3, 0, 3]
  assert mixed[1].to_json() | {'repo': ''} == (
      procgen.generate(str(tmp_path / 'one'), 3, 3).to_json() | {'repo': ''})
  with pytest.raises(ValueError, match='difficulties must be'):
    procgen.generate_suite(str(tmp_path), 2, difficulties=(0, 9))


def test_constant_task_grades_per_test_without_pytest(tmp_path):
  (task,) = procgen.generate_suite(str(tmp_path), 1, seed=8, difficulties=(0,))
  assert 'pytest' not in task.test_command
  ((path, old, new),) = task.metadata['solution']
  with BubblewrapSandbox(task.repo) as box:
    source = box.read_file(path).decode()
    box.write_file(path, source.replace(old, new).encode())
    fixed = reward.grade(box, task)
    # Verdicts come from the script's PASSED lines, one per test id.
    assert fixed.reward == 1.0 and fixed.output.count('PASSED ') == 4
    # A value that is neither the old nor the right one still fails every test.
    name = old.split(' = ')[0]
    box.write_file(path, source.replace(old, f'{name} = 1000\n').encode())
    assert set(reward.grade(box, task).passed.values()) == {False}
    box.write_file(path, b'def broken(:\n')  # no import, no verdict lines: all fail
    assert set(reward.grade(box, task).passed.values()) == {False}


def test_constant_task_solved_in_one_edit_then_finish(tmp_path):
  suite = procgen.generate_suite(str(tmp_path), 2, seed=21, difficulties=(0,))
  traces = solver.solve_suite(suite)  # checks: tests fail before, pass after
  for task, trace in zip(suite, traces):
    turns = [m for m in trace['messages'] if m['role'] == 'assistant']
    assert [c['function']['name'] for m in turns for c in m['tool_calls']] == [
        'edit_file', 'finish']
    ((path, old, new),) = task.metadata['solution']
    assert json.loads(turns[0]['tool_calls'][0]['function']['arguments']) == {
        'path': path, 'old_string': old, 'new_string': new}


def test_constant_solver_refuses_a_prompt_that_disagrees_with_the_gold_edit(tmp_path):
  (task,) = procgen.generate_suite(str(tmp_path), 1, seed=4, difficulties=(0,))
  task.prompt = task.prompt.replace(' is ', ' is 1', 1)
  with BubblewrapSandbox(task.repo) as box:
    with pytest.raises(solver.SolverError, match='disagree'):
      solver.solve(task, tools_lib.Toolbox(box))


def test_scripted_solver_solves_every_task_through_the_tools(tmp_path):
  suite, traces = _build(tmp_path, count=4, seed=11)  # one task of each difficulty
  assert len(traces) == len(suite) == 4
  assert all(trace['reward'] == 1.0 for trace in traces)


def _build(tmp_path, count, seed):
  return build_tasks.build_procgen(str(tmp_path), count, seed)


def test_traces_are_openai_messages_that_replay_to_the_same_result(tmp_path):
  (task,) = procgen.generate_suite(str(tmp_path), 1, seed=5)
  with BubblewrapSandbox(task.repo) as box:
    messages = solver.solve(task, tools_lib.Toolbox(box))
  assert [m['role'] for m in messages[:3]] == ['system', 'user', 'assistant']
  assert messages[1]['content'] == task.prompt
  ids = [c['id'] for m in messages if m['role'] == 'assistant' for c in m['tool_calls']]
  assert len(ids) == len(set(ids))
  for m in messages:
    if m['role'] == 'tool':
      assert m['tool_call_id'] in ids
    for c in m.get('tool_calls', []):
      json.loads(c['function']['arguments'])
  assert messages[-2]['tool_calls'][0]['function']['name'] == 'finish'
  # Replaying only the assistant turns in a fresh sandbox solves the task again.
  from c2jax.toolcalls import protocol  # pylint: disable=g-import-not-at-top
  with BubblewrapSandbox(task.repo) as box:
    toolbox = tools_lib.Toolbox(box)
    for m in messages:
      if m['role'] == 'assistant':
        calls = [(c['function']['name'], json.loads(c['function']['arguments']))
                 for c in m['tool_calls']]
        toolbox.run_turn(protocol.render_turn(m['content'], calls))
    assert reward.grade(box, task).reward == 1.0


def test_solver_refuses_when_the_code_is_not_as_expected(tmp_path):
  (task,) = procgen.generate_suite(str(tmp_path), 1, seed=2)
  with BubblewrapSandbox(task.repo) as box:
    path, old, _ = task.metadata['solution'][0]
    box.write_file(path, box.read_file(path).replace(old.encode(), b'# moved\n'))
    with pytest.raises(solver.SolverError, match='Expected exactly one'):
      solver.solve(task, tools_lib.Toolbox(box))


@pytest.mark.slow
def test_build_tasks_tool_writes_tasks_and_traces(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'tools.tasks.build_tasks', 'procgen',
       '--out', str(tmp_path), '--count', '4', '--seed', '7'],
      capture_output=True, text=True, cwd=ROOT)
  assert result.returncode == 0, result.stderr
  loaded = tasks_lib.load_jsonl(str(tmp_path / 'tasks.jsonl'))
  with open(tmp_path / 'traces.jsonl') as f:
    traces = [json.loads(line) for line in f]
  assert [t.id for t in loaded] == [t['task_id'] for t in traces]
  assert len(loaded) == 4


def test_agent_sft_eval_scores_the_first_call_against_the_gold_edit(tmp_path):
  from c2jax.toolcalls import protocol  # pylint: disable=g-import-not-at-top
  (task,) = procgen.generate_suite(str(tmp_path), 1, seed=9, difficulties=(0,))
  gold = task.metadata['solution'][0]
  edit = lambda new: protocol.render_call('edit_file', dict(
      path=gold[0], old_string=gold[1], new_string=new))
  assert eval_agent_sft.score_turn(edit(gold[2]), gold)['correct']
  wrong = eval_agent_sft.score_turn(edit(gold[2].replace(' = ', ' = 1')), gold)
  assert wrong['path'] and wrong['old_string'] and not wrong['new_string']
  assert not wrong['correct']
  finish_first = protocol.render_call('finish', {}) + edit(gold[2])
  assert not eval_agent_sft.score_turn(finish_first, gold)['edit_call']
  assert not eval_agent_sft.score_turn('no call at all', gold)['correct']
