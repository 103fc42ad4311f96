"""Revert-and-restore tasks from real projects with real test suites.

For a pure-Python package whose sdist ships its tests:
  1. download the sdist with pip (cached) and unpack it;
  2. run its tests in a sandbox to find those that pass;
  3. for candidate functions, replace the body with `raise NotImplementedError`
     (docstring kept) and rerun the tests in a fork;
  4. keep a candidate if some baseline-passing tests now fail: those are FAIL_TO_PASS,
     the ones still passing PASS_TO_PASS. Test files holding FAIL_TO_PASS tests are
     moved out of the task's repository into hidden_files; the gold patch (restoring the
     body) is kept in metadata['gold_patch'].
"""

import ast
import difflib
import glob as globlib
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile

from c2jax.env import sandbox as sandbox_lib
from c2jax.env import tasks as tasks_lib

DEFAULT_CACHE = os.path.expanduser('~/.cache/c2jax/sdists')
_PYTEST_LINE = re.compile(r'^(PASSED|FAILED|ERROR) (\S+)', re.M)


def _pattern(requirement: str) -> str:
  name, _, version = requirement.partition('==')
  return f'{name.replace("-", "?")}-{version or "*"}.tar.gz'


def cached_sdist(requirement: str, cache_dir: str = DEFAULT_CACHE) -> str | None:
  """The cached sdist of a pinned requirement, if any."""
  found = sorted(globlib.glob(os.path.join(cache_dir, _pattern(requirement))))
  return found[-1] if found and '==' in requirement else None


def download_sdist(requirement: str, cache_dir: str = DEFAULT_CACHE) -> str:
  """Path of the sdist for `requirement` (e.g. 'six==1.16.0'), downloading with pip."""
  if cached := cached_sdist(requirement, cache_dir):
    return cached
  os.makedirs(cache_dir, exist_ok=True)
  pattern = _pattern(requirement)
  proc = subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps',
                         '--no-binary', ':all:', '-d', cache_dir, requirement],
                        capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f'pip could not download the sdist of {requirement}:\n'
                       f'{proc.stderr[-2000:]}\nCheck the name/version and that PyPI '
                       'is reachable.')
  found = sorted(globlib.glob(os.path.join(cache_dir, pattern)))
  if not found:
    raise RuntimeError(f'pip downloaded {requirement} but no {pattern} appeared in '
                       f'{cache_dir}; the package may ship no .tar.gz sdist.')
  return found[-1]


def unpack(sdist: str, dest: str) -> str:
  with tarfile.open(sdist) as tar:
    tar.extractall(dest, filter='data')
    top = tar.getnames()[0].split('/')[0]
  return os.path.join(dest, top)


def _is_test_file(rel: str) -> bool:
  base = os.path.basename(rel)
  return (base.startswith('test_') or base.endswith('_test.py') or
          '/tests/' in f'/{rel}' or base == 'conftest.py')


def test_command(source_root: str) -> str:
  path = 'src:.' if os.path.isdir(os.path.join(source_root, 'src')) else '.'
  return f'PYTHONPATH={path} ' + tasks_lib.PYTEST_COMMAND


def candidate_functions(root: str) -> list[tuple[str, str, int, int]]:
  """(file, qualname, first body line, last body line) of replaceable functions."""
  found = []
  for dirpath, _, filenames in os.walk(root):
    for name in sorted(filenames):
      rel = os.path.relpath(os.path.join(dirpath, name), root)
      if not name.endswith('.py') or _is_test_file(rel) or name == 'setup.py':
        continue
      with open(os.path.join(root, rel), encoding='utf-8', errors='replace') as f:
        try:
          tree = ast.parse(f.read())
        except SyntaxError:
          continue
      for qualname, node in _functions(tree):
        body = node.body
        if (body and isinstance(body[0], ast.Expr) and
            isinstance(getattr(body[0], 'value', None), ast.Constant) and
            isinstance(body[0].value.value, str)):
          body = body[1:]  # keep the docstring: it is the under-specified spec
        # Bodies of >= 2 statements, starting below the def line (no one-liners).
        if len(body) >= 2 and body[0].lineno > node.lineno:
          found.append((rel, qualname, body[0].lineno, node.body[-1].end_lineno))
  return found


def _functions(node, prefix=''):
  """(qualified name, node) of every function and method under `node`."""
  for child in ast.iter_child_nodes(node):
    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      name = prefix + child.name
      if not isinstance(child, ast.ClassDef):
        yield name, child
      yield from _functions(child, name + '.')


def revert_body(text: str, first: int, last: int) -> str:
  lines = text.splitlines(keepends=True)
  indent = re.match(r'\s*', lines[first - 1]).group(0)
  return ''.join(lines[:first - 1] + [f'{indent}raise NotImplementedError\n'] +
                 lines[last:])


def _statuses(output: str) -> dict[str, str]:
  return dict((test, status) for status, test in _PYTEST_LINE.findall(output))


def build(requirement: str, out_dir: str, make_sandbox, max_tasks: int = 3,
          max_candidates: int = 20, seed: int = 0,
          cache_dir: str = DEFAULT_CACHE) -> list[tasks_lib.Task]:
  """Builds up to max_tasks tasks from one package. make_sandbox(repo) -> Sandbox."""
  source = unpack(download_sdist(requirement, cache_dir), os.path.join(out_dir, '_src'))
  command = test_command(source)
  with make_sandbox(source) as base:
    baseline = _statuses(base.run_shell(command.replace('{tests}', '')).text)
    passing = sorted(t for t, s in baseline.items() if s == 'PASSED')
    if not passing:
      raise RuntimeError(f'No test of {requirement} passes unmodified in the sandbox; '
                         'it may need dependencies the sandbox lacks.')
    candidates = candidate_functions(source)
    random.Random(seed).shuffle(candidates)
    tasks = []
    for rel, func, first, last in candidates[:max_candidates]:
      if len(tasks) >= max_tasks:
        break
      with open(os.path.join(source, rel)) as f:
        original = f.read()
      reverted = revert_body(original, first, last)
      with base.fork() as trial:
        trial.write_file(rel, reverted.encode())
        after = _statuses(trial.run_shell(command.replace('{tests}', '')).text)
      fail_to_pass = [t for t in passing if after.get(t) != 'PASSED']
      # Nothing failing: not a task. Everything failing: the module no longer imports,
      # so the tests say nothing about this function; skip both.
      if not fail_to_pass or (len(fail_to_pass) == len(passing) > 1):
        continue
      tasks.append(_make_task(requirement, source, rel, func, original, reverted,
                              fail_to_pass, [t for t in passing if t not in fail_to_pass],
                              command, out_dir, len(tasks)))
  return tasks


def _make_task(requirement, source, rel, func, original, reverted, fail_to_pass,
               pass_to_pass, command, out_dir, number) -> tasks_lib.Task:
  task_id = f'{requirement.replace("==", "-")}-{func}-{number}'
  repo = os.path.join(out_dir, task_id)
  shutil.copytree(source, repo, symlinks=True)
  with open(os.path.join(repo, rel), 'w') as f:
    f.write(reverted)
  hidden = {}
  for test_file in sorted({t.split('::')[0] for t in fail_to_pass}):
    with open(os.path.join(repo, test_file)) as f:
      hidden[test_file] = f.read()
    os.remove(os.path.join(repo, test_file))
  gold = ''.join(difflib.unified_diff(reverted.splitlines(keepends=True),
                                      original.splitlines(keepends=True),
                                      f'a/{rel}', f'b/{rel}'))
  module = rel[:-3].replace('/', '.').removeprefix('src.')
  return tasks_lib.Task(
      id=task_id, repo=repo, prompt=f'Implement {func} in {module}.',
      test_command=command, fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass,
      hidden_files=hidden,
      metadata={'source': 'revert_restore', 'package': requirement, 'file': rel,
                'function': func, 'gold_patch': gold, 'category': 'implement',
                'difficulty': min(4, 1 + len(fail_to_pass) // 5)})


def apply_gold_patch(sandbox: sandbox_lib.Sandbox, task: tasks_lib.Task) -> None:
  """Restores the original body (for checking a task: its tests must then pass)."""
  sandbox.write_file('.gold.patch', task.metadata['gold_patch'].encode())
  result = sandbox.run_shell('patch -p1 < .gold.patch && rm .gold.patch')
  if result.exit_code != 0:
    raise RuntimeError(f'Gold patch of {task.id} did not apply:\n{result.text}')
