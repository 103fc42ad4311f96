"""Task format, loaders and rewards from hidden tests."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

from c2jax.env import reward, tasks
from env_testlib import write_tree

_TEST_FILE = ('from pkg.mathx import add, mul\n\n'
              'def test_add():\n    assert add(2, 3) == 5\n\n'
              'def test_mul():\n    assert mul(2, 3) == 6\n\n'
              'def test_add_neg():\n    assert add(-1, 1) == 0\n')


def _task(repo, **kw):
  fields = dict(id='t1', repo=repo, prompt='fix add',
                fail_to_pass=['tests/test_m.py::test_add', 'tests/test_m.py::test_add_neg'],
                pass_to_pass=['tests/test_m.py::test_mul'],
                hidden_files={'tests/test_m.py': _TEST_FILE})
  fields.update(kw)
  return tasks.Task(**fields)


def test_reward_binary_and_fraction(box, repo):
  task = _task(repo)
  assert reward.grade(box, task).reward == 1.0
  box.write_file('pkg/mathx.py', b'def add(a, b):\n    return 5 if a == 2 else a - b\n\n'
                 b'def mul(a, b):\n    return a * b\n')
  graded = reward.grade(box, task)
  assert graded.passed == {'tests/test_m.py::test_add': True,
                           'tests/test_m.py::test_add_neg': False,
                           'tests/test_m.py::test_mul': True}
  assert graded.reward == 0.0
  assert reward.grade(box, task, reward='fraction').reward == 0.5
  # The hidden tests never appear in the agent's workspace.
  assert 'tests/test_m.py' not in box.list_files()
  with pytest.raises(ValueError, match="Unknown reward 'partial'"):
    reward.grade(box, task, reward='partial')


def test_fraction_is_zero_when_a_pass_to_pass_test_breaks(box, repo):
  box.write_file('pkg/mathx.py', b'def add(a, b):\n    return a + b\n\n'
                 b'def mul(a, b):\n    return 0\n')
  assert reward.grade(box, _task(repo), reward='fraction').reward == 0.0


def test_test_patch_is_applied_only_for_grading(box, repo):
  patch = ('--- /dev/null\n+++ b/tests/test_p.py\n@@ -0,0 +1,3 @@\n'
           '+from pkg.text import shout\n+def test_shout():\n'
           '+    assert shout("a") == "A!"\n')
  task = _task(repo, fail_to_pass=['tests/test_p.py::test_shout'], pass_to_pass=[],
               hidden_files={}, test_patch=patch)
  assert reward.grade(box, task).reward == 1.0
  assert 'tests/test_p.py' not in box.list_files()


def test_test_command_may_contain_shell_braces(box, repo):
  command = 'P=python; ${P} -c "print({1: 2})" && ' + tasks.PYTEST_COMMAND
  assert reward.grade(box, _task(repo, test_command=command)).reward == 1.0


def test_setup_commands_run_and_fail_loudly(box, repo):
  reward.prepare(box, _task(repo, setup_commands=['echo ready > setup.txt']))
  assert box.read_file('setup.txt') == b'ready\n'
  with pytest.raises(RuntimeError, match="Setup command 'exit 3' of task t1 failed"):
    reward.prepare(box, _task(repo, setup_commands=['exit 3']))


def test_task_needs_fail_to_pass_and_round_trips(tmp_path, repo):
  with pytest.raises(ValueError, match='no FAIL_TO_PASS'):
    tasks.Task(id='x', repo=repo, prompt='p')
  path = str(tmp_path / 't.jsonl')
  tasks.save_jsonl([_task(repo, metadata={'difficulty': 2})], path)
  (loaded,) = tasks.load_jsonl(path)
  assert loaded == _task(repo, metadata={'difficulty': 2})
  with pytest.raises(ValueError, match=r"unknown keys \['colour'\]"):
    tasks.Task.from_json(dict(loaded.to_json(), colour=1))


def test_swebench_loader(tmp_path, repo):
  os.symlink(repo, tmp_path / 'proj__1')
  record = {'instance_id': 'proj__1', 'repo': 'org/proj', 'base_commit': 'abc',
            'problem_statement': 'add is wrong', 'patch': 'diff...', 'test_patch': 'tp',
            'FAIL_TO_PASS': json.dumps(['t::a']), 'PASS_TO_PASS': '[]'}
  path = tmp_path / 'swe.jsonl'
  path.write_text(json.dumps(record) + '\n\n')
  (task,) = tasks.load_swebench_jsonl(str(path), str(tmp_path))
  assert (task.id, task.prompt, task.fail_to_pass, task.test_patch) == (
      'proj__1', 'add is wrong', ['t::a'], 'tp')
  assert task.metadata['gold_patch'] == 'diff...'
  path.write_text(json.dumps(dict(record, instance_id='other')) + '\n')
  with pytest.raises(FileNotFoundError, match='clone org/proj at abc there'):
    tasks.load_swebench_jsonl(str(path), str(tmp_path))


def test_terminal_bench_and_harbor_folders_grade_by_exit_status(tmp_path, box):
  tb = write_tree(tmp_path / 'tb-task', {
      'task.yaml': 'instruction: Create hello.txt saying hi.\ndifficulty: easy\n'
                   'category: files\n',
      'run-tests.sh': 'test "$(cat hello.txt)" = hi\n',
      'tests/test_outputs.py': '# checked by run-tests.sh\n'})
  harbor = write_tree(tmp_path / 'hb-task', {
      'task.toml': '[metadata]\ndifficulty = "medium"\ncategory = "files"\n',
      'instruction.md': 'Create hello.txt saying hi.',
      'environment/README': 'start here\n',
      'tests/test.sh': 'test "$(cat hello.txt)" = hi\n'})
  t1, t2 = tasks.load_task_folder(tb), tasks.load_task_folder(harbor)
  assert t1.prompt == 'Create hello.txt saying hi.' and t1.metadata['difficulty'] == 'easy'
  assert t2.metadata == {'source': 'harbor', 'category': 'files', 'difficulty': 'medium'}
  assert os.listdir(t2.repo) == ['README']
  for task in (t1, t2):
    assert reward.grade(box, task).reward == 0.0
  box.write_file('hello.txt', b'hi')
  for task in (t1, t2):
    assert reward.grade(box, task).reward == 1.0
  with pytest.raises(FileNotFoundError, match='is not a task folder'):
    tasks.load_task_folder(str(tmp_path))
  # A folder without an environment folder starts from one empty folder per process,
  # gone when the process ends (not one left in /tmp per load).
  assert os.listdir(t1.repo) == [] and tasks.load_task_folder(tb).repo == t1.repo
  shown = subprocess.run(
      [sys.executable, '-c', 'import sys; from c2jax.env import tasks; '
       'print(tasks.load_task_folder(sys.argv[1]).repo)', tb],
      capture_output=True, text=True, check=True).stdout.strip()
  assert shown.startswith(tempfile.gettempdir()) and not os.path.exists(shown)
