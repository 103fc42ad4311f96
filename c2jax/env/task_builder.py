"""Task builders over an installed repository, written as a SWE-bench-format suite.

    records = build_suite(install_result, 'out/suite.jsonl', kinds=('mutate', 'revert'))
    tasks = load_swebench_jsonl('out/suite.jsonl', 'out/suite.repos')

Every candidate edit (bug_injection.mutations: a planted bug; revert: a function body
replaced by `raise NotImplementedError`, as revert_restore.py does for pinned sdists) is
applied in a fork of a sandbox that starts from the repository's environment layer, and
the tests run, twice for each tree: tests that passed in both baseline runs and fail
in both edited runs are FAIL_TO_PASS, those that pass in all four PASS_TO_PASS, and an
id whose result differs between two runs of one tree is flaky and in neither. Then the
task is graded as grading will run it (its ids named on pytest's command line, in that
order), twice on the edited tree and twice on the untouched one: an id that changes
there (a test that needs the rest of the suite, or its order) goes. An edit no test
catches, or one that breaks every test (the module no longer imports), is discarded. Each task's repository is the edited tree without the
test files that hold its FAIL_TO_PASS tests; those come back as `test_patch` at grading.
`patch` is the gold fix (the edit reversed). Records carry c2jax's `environment` (the
layer) and `test_command`, which load_swebench_jsonl reads.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
import random
import re
import shlex
import shutil

from c2jax.env import bubblewrap, bug_injection, revert_restore
from c2jax.env.install import verify

KINDS = ('mutate', 'revert')


def _join(lines) -> str:
  # A last line without a newline needs patch's marker, or the diff is malformed.
  return ''.join(line if line.endswith('\n') else line + '\n\\ No newline at end of file\n'
                 for line in lines)


def unified_diff(before: str, after: str, rel: str) -> str:
  return _join(difflib.unified_diff(before.splitlines(keepends=True),
                                    after.splitlines(keepends=True), f'a/{rel}', f'b/{rel}'))


def added_file_diff(text: str, rel: str) -> str:
  return _join(difflib.unified_diff([], text.splitlines(keepends=True), '/dev/null',
                                    f'b/{rel}'))


def _candidates(repo: str, kinds, seed: int):
  """(kind, file, function, original text, edited text), kinds interleaved."""
  streams = []
  if 'mutate' in kinds:
    streams.append([('mutate', m.file, m.function, m.original, m.mutated)
                    for m in bug_injection.mutations(repo, seed, per_function=2)])
  if 'revert' in kinds:
    reverts = []
    for rel, func, first, last in revert_restore.candidate_functions(repo):
      with open(os.path.join(repo, rel), encoding='utf-8') as f:
        original = f.read()
      reverts.append(('revert', rel, func, original,
                      revert_restore.revert_body(original, first, last)))
    random.Random(seed).shuffle(reverts)
    streams.append(reverts)
  for group in itertools.zip_longest(*streams):
    yield from (candidate for candidate in group if candidate is not None)


def _run_twice(sandbox, command: str, tests: list[str] | None = None):
  """(ids that passed in both runs, in the first run's order; ids that passed in
  either; the last output) of the test command run twice, over `tests` (in grading's
  order) or every test. An id that passes in one run only is flaky: never a test to
  count on either way."""
  selected = ' '.join(shlex.quote(t) for t in tests) if tests else ''
  first, second = (verify.parse(r.text, r.exit_code) for r in
                   (sandbox.run_shell(command.replace('{tests}', selected))
                    for _ in range(2)))
  again = set(second.passed)
  return ([t for t in first.passed if t in again], set(first.passed) | again,
          second.output)


def _first_failure(output: str) -> str:
  lines = [line for line in output.splitlines() if line.startswith('E ')]
  return '\n'.join(lines[:8])


def _statement(kind, module, func, fail_to_pass, output) -> str:
  if kind == 'revert':
    return f'Implement `{func}` in `{module}`; it currently raises NotImplementedError.'
  shown = ', '.join(f'`{t}`' for t in fail_to_pass[:5])
  more = f' and {len(fail_to_pass) - 5} more' if len(fail_to_pass) > 5 else ''
  failure = _first_failure(output)
  return (f'Some tests of `{module}` fail: {shown}{more}.\n'
          + (f'The first failure says:\n```\n{failure}\n```\n' if failure else '')
          + 'Find the bug in the library code and fix it; do not edit the tests.')


def build_suite(install_result, out_path: str, kinds=KINDS, max_tasks: int = 8,
                max_candidates: int = 40, seed: int = 0, timeout_s: float = 600.0,
                memory_mb: int = 4096, package=None) -> list[dict]:
  """Writes the suite to out_path (JSONL) and each task's repository under
  `<out_path without .jsonl>.repos/<instance_id>`; returns the records. `package`
  (c2jax.env.packages.Package): the sdist was fetched as that package, whose exact
  spec the records name as `repo`."""
  if not install_result.ok:
    raise ValueError(f'{install_result.repo} is not installed (its install failed: '
                     f'{install_result.error[-300:]}); fix the install first.')
  bad = sorted(set(kinds) - set(KINDS))
  if bad or not kinds:
    raise ValueError(f'Unknown task kind(s) {bad or kinds}; choose from {KINDS}.')
  repo, layer, command = install_result.repo, install_result.layer, install_result.test_command
  repos_root = re.sub(r'\.jsonl$', '', out_path) + '.repos'
  label = package.name if package else os.path.basename(os.path.normpath(repo))
  name = re.sub(r'[^A-Za-z0-9_.-]', '_', label)
  origin = package.spec if package else os.path.basename(os.path.normpath(repo))
  records = []
  with bubblewrap.BubblewrapSandbox(repo, env_layer=layer, timeout_s=timeout_s,
                                    memory_mb=memory_mb) as base:
    passing, _, _ = _run_twice(base, command)
    if not passing:
      raise RuntimeError(f'No test of {repo} passes twice in a row in its environment '
                         'layer; nothing can tell a planted bug from the baseline.')
    for number, (kind, rel, func, original, edited) in enumerate(
        _candidates(repo, kinds, seed)):
      if len(records) >= max_tasks or number >= max_candidates:
        break
      with base.fork() as trial:
        trial.write_file(rel, edited.encode())
        both, either, output = _run_twice(trial, command)
        fail_to_pass = [t for t in passing if t not in either]
        pass_to_pass = [t for t in passing if t in both]
        if not fail_to_pass or (len(fail_to_pass) == len(passing) > 1):
          continue
        # As grading runs them (these ids, in this order) the edit must still fail its
        # FAIL_TO_PASS ids and the untouched tree pass them all: a test that depends on
        # the others' order, or on the whole suite running, goes.
        graded_both, graded_either, _ = _run_twice(trial, command, fail_to_pass + pass_to_pass)
      gold, _, _ = _run_twice(base, command, fail_to_pass + pass_to_pass)
      fail_to_pass = [t for t in fail_to_pass if t not in graded_either and t in gold]
      pass_to_pass = [t for t in pass_to_pass if t in graded_both and t in gold]
      if not fail_to_pass:
        continue
      instance_id = re.sub(r'[^A-Za-z0-9_.-]', '_', f'{name}.{kind}.{func}.{len(records)}')
      records.append(_write_task(
          instance_id, kind, repo, rel, func, original, edited, fail_to_pass,
          pass_to_pass, output, repos_root, layer, command, origin))
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  with open(out_path + '.tmp', 'w') as f:
    for record in records:
      f.write(json.dumps(record) + '\n')
  os.replace(out_path + '.tmp', out_path)
  return records


def _write_task(instance_id, kind, repo, rel, func, original, edited, fail_to_pass,
                pass_to_pass, output, repos_root, layer, command, origin) -> dict:
  task_repo = os.path.join(repos_root, instance_id)
  shutil.rmtree(task_repo, ignore_errors=True)
  shutil.copytree(repo, task_repo, symlinks=True,
                  ignore=shutil.ignore_patterns('__pycache__', '.pytest_cache'))
  with open(os.path.join(task_repo, rel), 'w', encoding='utf-8') as f:
    f.write(edited)
  test_patch = ''
  for test_file in sorted({t.split('::')[0] for t in fail_to_pass}):
    with open(os.path.join(task_repo, test_file), encoding='utf-8') as f:
      test_patch += added_file_diff(f.read(), test_file)
    os.remove(os.path.join(task_repo, test_file))
  module = rel[:-3].replace('/', '.').removeprefix('src.').removesuffix('.__init__')
  return {
      'instance_id': instance_id, 'repo': origin,
      'base_commit': '', 'version': '', 'created_by': kind,
      'problem_statement': _statement(kind, module, func, fail_to_pass, output),
      'patch': unified_diff(edited, original, rel), 'test_patch': test_patch,
      'FAIL_TO_PASS': json.dumps(fail_to_pass), 'PASS_TO_PASS': json.dumps(pass_to_pass),
      'environment': layer, 'test_command': command, 'test_parser': 'pytest',
      'language': 'python',
  }
