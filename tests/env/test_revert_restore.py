"""Revert-and-restore tasks from a real sdist: pure helpers, and one real package."""

import socket

import pytest

from c2jax.env import reward, revert_restore
from c2jax.env.bubblewrap import BubblewrapSandbox

_SOURCE = '''def f(x):
    """Doubles x."""
    y = x * 2
    return y


class C:
    def m(self):
        a = 1
        return a

    def short(self): return 1
'''


def test_candidates_and_revert_keep_docstrings(tmp_path):
  (tmp_path / 'mod.py').write_text(_SOURCE)
  (tmp_path / 'tests').mkdir()
  (tmp_path / 'tests' / 'test_mod.py').write_text(_SOURCE)
  found = revert_restore.candidate_functions(str(tmp_path))
  assert found == [('mod.py', 'f', 3, 4), ('mod.py', 'C.m', 9, 10)]
  reverted = revert_restore.revert_body(_SOURCE, 3, 4)
  assert reverted.startswith('def f(x):\n    """Doubles x."""\n    raise NotImplementedError\n\n')


def _pypi_reachable() -> bool:
  try:
    socket.create_connection(('pypi.org', 443), timeout=5).close()
    return True
  except OSError:
    return False


@pytest.mark.slow
def test_real_package_tasks_fail_reverted_and_pass_with_the_gold_patch(tmp_path):
  if not revert_restore.cached_sdist('six==1.16.0') and not _pypi_reachable():
    pytest.skip('PyPI is unreachable and six-1.16.0 is not in the sdist cache.')
  tasks = revert_restore.build('six==1.16.0', str(tmp_path), BubblewrapSandbox,
                               max_tasks=1, max_candidates=8, seed=0)
  assert len(tasks) == 1
  (task,) = tasks
  assert task.fail_to_pass and task.pass_to_pass
  assert task.prompt.startswith('Implement ') and len(task.prompt) < 120
  assert all(path not in task.hidden_files for path in [task.metadata['file']])
  with BubblewrapSandbox(task.repo) as box:
    for path in task.hidden_files:
      assert path not in box.list_files()  # the tests are hidden from the agent
    assert reward.grade(box, task).reward == 0.0
    revert_restore.apply_gold_patch(box, task)
    assert reward.grade(box, task).reward == 1.0
