"""Fixture builders for eval tests: tiny SWE-bench, Terminal-Bench, Harbor and sdist
sources written on the fly (no network)."""

import difflib
import io
import json
import os
import tarfile

BUGGY = 'def area(w, h):\n    """Area of a w x h rectangle."""\n    return w + h\n'
FIXED = 'def area(w, h):\n    """Area of a w x h rectangle."""\n    return w * h\n'


def write_tree(root, files):
  for path, text in files.items():
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, 'w') as f:
      f.write(text)
  return str(root)


def _diff(path, old, new):
  return ''.join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                      f'a/{path}', f'b/{path}'))


def swebench_fixture(root):
  """(jsonl path, repos_root) with one instance in the official field layout."""
  repos = os.path.join(root, 'repos')
  write_tree(os.path.join(repos, 'demo__geo-1'), {
      'geo/__init__.py': '', 'geo/shapes.py': BUGGY,
      'tests/test_old.py': 'def test_truth():\n    assert True\n'})
  new_test = 'from geo.shapes import area\n\n\ndef test_area():\n    assert area(3, 4) == 12\n'
  test_patch = ('--- /dev/null\n+++ b/tests/test_area.py\n@@ -0,0 +1,5 @@\n'
                + ''.join('+' + line for line in new_test.splitlines(True)))
  record = {'instance_id': 'demo__geo-1', 'repo': 'demo/geo', 'base_commit': 'abc123',
            'patch': _diff('geo/shapes.py', BUGGY, FIXED), 'test_patch': test_patch,
            'problem_statement': 'area() adds the sides instead of multiplying them.',
            'FAIL_TO_PASS': json.dumps(['tests/test_area.py::test_area']),
            'PASS_TO_PASS': json.dumps(['tests/test_old.py::test_truth']), 'version': '1.0'}
  path = os.path.join(root, 'instances.jsonl')
  with open(path, 'w') as f:
    f.write(json.dumps(record) + '\n')
  return path, repos


def swebench_git_fixture(root):
  """(jsonl path, clone): the instance's base_commit is the first of two commits."""
  import subprocess
  clone = os.path.join(root, 'clone')
  path, repos = swebench_fixture(root)
  os.rename(os.path.join(repos, 'demo__geo-1'), clone)
  git = lambda *a: subprocess.run(['git', '-C', clone, '-c', 'user.name=t',
                                   '-c', 'user.email=t@t', *a], check=True,
                                  capture_output=True, text=True).stdout.strip()
  git('init', '-q')
  git('add', '.')
  git('commit', '-qm', 'base')
  base = git('rev-parse', 'HEAD')
  write_tree(clone, {'geo/shapes.py': FIXED})  # a later commit: the fix upstream
  git('commit', '-qam', 'fix')
  with open(path) as f:
    record = json.loads(f.read())
  record['base_commit'] = base
  with open(path, 'w') as f:
    f.write(json.dumps(record) + '\n')
  return path, clone


def task_folders_fixture(root):
  """A folder holding one Terminal-Bench and one Harbor task, each with a solution."""
  write_tree(os.path.join(root, 'tb-hello'), {
      'task.yaml': 'instruction: Write the word hello into hello.txt.\ncategory: files\n'
                   'difficulty: easy\n',
      'run-tests.sh': 'test "$(cat hello.txt)" = hello\n',
      'tests/test_outputs.py': '# the checks live in run-tests.sh\n',
      'solution.sh': 'echo hello > hello.txt\n',
      'environment/README.md': 'empty project\n'})
  write_tree(os.path.join(root, 'harbor-answer'), {
      'task.toml': '[metadata]\ncategory = "files"\ndifficulty = "easy"\n',
      'instruction.md': 'Write 42 into out.txt.\n',
      'tests/test.sh': 'grep -qx 42 out.txt\n',
      'solution/solve.sh': 'echo 42 > out.txt\n'})
  return str(root)


def sdist_fixture(cache_dir):
  """minipkg-1.0.tar.gz in cache_dir: three functions, one test file each."""
  os.makedirs(cache_dir, exist_ok=True)
  files = {
      'minipkg/__init__.py': '',
      'minipkg/ops.py': ''.join(
          f'def {name}(a, b):\n    """{name} of a and b."""\n    result = a {op} b\n'
          f'    return result\n\n\n' for name, op in (('plus', '+'), ('minus', '-'),
                                                    ('times', '*'))),
      'tests/test_plus.py': 'from minipkg.ops import plus\n\n\ndef test_plus():\n'
                            '    assert plus(2, 3) == 5\n',
      'tests/test_minus.py': 'from minipkg.ops import minus\n\n\ndef test_minus():\n'
                             '    assert minus(2, 3) == -1\n',
      'tests/test_times.py': 'from minipkg.ops import times\n\n\ndef test_times():\n'
                             '    assert times(2, 3) == 6\n'}
  path = os.path.join(cache_dir, 'minipkg-1.0.tar.gz')
  with tarfile.open(path, 'w:gz') as tar:
    for rel, text in files.items():
      data = text.encode()
      info = tarfile.TarInfo(f'minipkg-1.0/{rel}')
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return path
