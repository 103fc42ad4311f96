"""Task builders over an installed repository, written as a SWE-bench-format suite.

    records = build_suite(install_result, 'out/suite.jsonl', kinds=('mutate', 'revert'))
    tasks = load_swebench_jsonl('out/suite.jsonl', 'out/suite.repos')

Every candidate edit (bug_injection.mutations: a planted bug; revert: a function body
replaced by `raise NotImplementedError`, as revert_restore.py does for pinned sdists) is
applied in a fork of a sandbox that starts from the repository's environment layer, and
the tests run: baseline-passing tests that now fail are FAIL_TO_PASS, the rest
PASS_TO_PASS. An edit no test catches, or one that breaks every test (the module no
longer imports), is discarded. Each task's repository is the edited tree without the
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
                memory_mb: int = 4096) -> list[dict]:
  """Writes the suite to out_path (JSONL) and each task's repository under
  `<out_path without .jsonl>.repos/<instance_id>`; returns the records."""
  if not install_result.ok:
    raise ValueError(f'{install_result.repo} is not installed (its install failed: '
                     f'{install_result.error[-300:]}); fix the install first.')
  bad = sorted(set(kinds) - set(KINDS))
  if bad or not kinds:
    raise ValueError(f'Unknown task kind(s) {bad or kinds}; choose from {KINDS}.')
  repo, layer, command = install_result.repo, install_result.layer, install_result.test_command
  repos_root = re.sub(r'\.jsonl$', '', out_path) + '.repos'
  name = re.sub(r'[^A-Za-z0-9_.-]', '_', os.path.basename(os.path.normpath(repo)))
  records = []
  with bubblewrap.BubblewrapSandbox(repo, env_layer=layer, timeout_s=timeout_s,
                                    memory_mb=memory_mb) as base:
    run = base.run_shell(command.replace('{tests}', ''))
    baseline = verify.parse(run.text, run.exit_code)
    passing = baseline.passed
    if not passing:
      raise RuntimeError(f'No test of {repo} passes in its environment layer; nothing can '
                         'tell a planted bug from the baseline.')
    for number, (kind, rel, func, original, edited) in enumerate(
        _candidates(repo, kinds, seed)):
      if len(records) >= max_tasks or number >= max_candidates:
        break
      with base.fork() as trial:
        trial.write_file(rel, edited.encode())
        run = trial.run_shell(command.replace('{tests}', ''))
        after = verify.parse(run.text, run.exit_code)
      now_passing = set(after.passed)
      fail_to_pass = [t for t in passing if t not in now_passing]
      if not fail_to_pass or (len(fail_to_pass) == len(passing) > 1):
        continue
      instance_id = re.sub(r'[^A-Za-z0-9_.-]', '_', f'{name}.{kind}.{func}.{len(records)}')
      records.append(_write_task(
          instance_id, kind, repo, rel, func, original, edited, fail_to_pass,
          [t for t in passing if t in now_passing], after.output, repos_root, layer, command))
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  with open(out_path + '.tmp', 'w') as f:
    for record in records:
      f.write(json.dumps(record) + '\n')
  os.replace(out_path + '.tmp', out_path)
  return records


def _write_task(instance_id, kind, repo, rel, func, original, edited, fail_to_pass,
                pass_to_pass, output, repos_root, layer, command) -> dict:
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
      'instance_id': instance_id, 'repo': os.path.basename(os.path.normpath(repo)),
      'base_commit': '', 'version': '', 'created_by': kind,
      'problem_statement': _statement(kind, module, func, fail_to_pass, output),
      'patch': unified_diff(edited, original, rel), 'test_patch': test_patch,
      'FAIL_TO_PASS': json.dumps(fail_to_pass), 'PASS_TO_PASS': json.dumps(pass_to_pass),
      'environment': layer, 'test_command': command,
  }
