"""Procedural tasks: bugs are real, and the scripted solver solves every one of them
through the tool protocol, leaving valid SFT traces."""

import json
import os
import subprocess
import sys

import pytest

from c2jax.env import procgen, reward, solver
from c2jax.env import tasks as tasks_lib
from c2jax.env import tools as tools_lib
from c2jax.env.bubblewrap import BubblewrapSandbox

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_generation_is_deterministic_and_graded(tmp_path):
  a = procgen.generate_suite(str(tmp_path / 'a'), 8, seed=3)
  b = procgen.generate_suite(str(tmp_path / 'b'), 8, seed=3)
  assert [t.hidden_files for t in a] == [t.hidden_files for t in b]
  assert [t.metadata['difficulty'] for t in a] == [1, 2, 3, 4] * 2
  assert {t.metadata['category'] for t in a} == set(procgen.CATEGORIES.values())
  multi = [t for t in a if t.metadata['difficulty'] == 3][0]
  assert len({path for path, _, _ in multi.metadata['solution']}) == 2
  for task in a:  # hidden tests are not in the repository
    assert not os.path.exists(os.path.join(task.repo, 'tests'))
  with pytest.raises(ValueError, match='difficulty must be one of'):
    procgen.generate(str(tmp_path), 0, 7)


def test_scripted_solver_solves_every_task_through_the_tools(tmp_path):
  suite, traces = _build(tmp_path, count=4, seed=11)  # one task of each difficulty
  assert len(traces) == len(suite) == 4
  assert all(trace['reward'] == 1.0 for trace in traces)


def _build(tmp_path, count, seed):
  sys.path.insert(0, os.path.join(ROOT, 'tools'))
  try:
    import build_tasks  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
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
  from c2jax.agent import protocol  # pylint: disable=g-import-not-at-top
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
      [sys.executable, os.path.join(ROOT, 'tools', 'build_tasks.py'), 'procgen',
       '--out', str(tmp_path), '--count', '4', '--seed', '7'],
      capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.returncode == 0, result.stderr
  loaded = tasks_lib.load_jsonl(str(tmp_path / 'tasks.jsonl'))
  with open(tmp_path / 'traces.jsonl') as f:
    traces = [json.loads(line) for line in f]
  assert [t.id for t in loaded] == [t['task_id'] for t in traces]
  assert len(loaded) == 4
