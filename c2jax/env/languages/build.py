"""Planted-bug and revert tasks from a Go, Rust or JavaScript / TypeScript checkout, as
a SWE-bench-format suite and a build report.

  records = build_suite('path/to/checkout', 'out/suite.jsonl')
  # also out/suite.repos/<instance_id>/ and out/suite.report.json

1. The checkout (without .git) is copied to a scratch folder and its language prepares
   it: `go mod vendor`, `cargo vendor`, `npm ci` run ON THE HOST, with network and
   without a sandbox (unlike Python's `c2jax tasks install`, which runs its commands in
   bubblewrap behind an egress allowlist), so only build from checkouts you trust. What
   they fetch stays in the tree, so every later run is offline.
2. The tests run in a bubblewrap sandbox over that copy (no network, the usual limits),
   the language's toolchain bound read-only (Language.toolchain_binds), twice. Each
   candidate edit runs twice in a fork of it: `mutate` (mutate.py: one operator or
   literal of one source line) and `revert` (revert.py: a function's body replaced by a
   statement that fails), interleaved. A test whose status differs between the two
   runs of one tree is flaky and counts for nothing. FAIL_TO_PASS: passed in both base
   runs, failed (not skipped) in both edited runs; PASS_TO_PASS: passed in all four.
   An edited tree's run gets candidate_timeout (5x the base runs' slowest, at least
   30 s): an edit that hangs the tests is dropped after one such run.
3. A candidate is kept when it has FAIL_TO_PASS tests. Unlike task_builder.py's Python
   rule, one that fails every test is kept: a test counts only when the log reports it
   failed by its own id, and an edit that breaks the build (a compile error, a module
   that no longer loads) leaves the tests unreported (the file or package fails under
   its own id), so it has no FAIL_TO_PASS and is dropped anyway. The report
   (`<out>.report.json`) lists every candidate tried, kept or dropped and why, so an
   empty suite explains itself.
4. Each task's repository is the prepared tree with the edit, without the test files
   holding its FAIL_TO_PASS tests (Language.test_files_for), which come back as
   `test_patch`; `patch` is the gold fix. Records are task_builder.build_suite's plus
   `language` and `test_parser`; `environment` is '': sandbox.make_task_sandbox mounts
   the record's language's toolchain (c2jax/env/toolchains.py) where it lives outside
   /usr, so its tasks grade where the RL loop and `c2jax eval` run them.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import time

from c2jax.env import bubblewrap, task_builder, testlogs
from c2jax.env.languages import base, mutate, registry, revert

_diff, _added_file_diff = task_builder.unified_diff, task_builder.added_file_diff
# An edited tree's tests get this many times the unchanged tree's slowest run, and at
# least the floor (a cold build cache, a loaded machine), before the edit is dropped.
CANDIDATE_TIMEOUT_FACTOR = 5.0
CANDIDATE_TIMEOUT_FLOOR_S = 30.0


def report_path(out_path: str) -> str:
  return re.sub(r'\.jsonl$', '', out_path) + '.report.json'


def _stable(first: testlogs.TestReport, second: testlogs.TestReport):
  """(statuses both runs agree on, ids they disagree on: flaky)."""
  ids = set(first.statuses) | set(second.statuses)
  stable = {t: first.statuses[t] for t in ids
            if t in first.statuses and first.statuses[t] == second.statuses.get(t)}
  return stable, sorted(ids - set(stable))


def _run_twice(sandbox, command: str, parser: str, timeout_s: float | None = None) -> dict:
  """The tests of one tree, run twice: the statuses both runs agree on, the flaky ids,
  what the parser found odd, whether any test was seen, the last run's output, the
  slowest run's seconds, and whether a run timed out (then there is no second run:
  it would only time out again)."""
  results, seconds = [], 0.0
  for _ in range(2):
    started = time.monotonic()
    results.append(sandbox.run_shell(command, timeout_s=timeout_s))
    seconds = max(seconds, time.monotonic() - started)
    if results[-1].timed_out:
      break
  first, second = (testlogs.parse(parser, results[k].text) for k in (0, -1))
  statuses, flaky = _stable(first, second)
  return {'statuses': statuses, 'flaky': flaky,
          'problems': list(dict.fromkeys(first.problems + second.problems)),
          'seen': bool(first.statuses or second.statuses), 'output': results[-1].text,
          'seconds': seconds, 'timed_out': results[-1].timed_out}


def candidate_timeout(baseline_s: float, timeout_s: float) -> float:
  """How long an edited tree's tests may run: CANDIDATE_TIMEOUT_FACTOR times the
  unchanged tree's slowest run, at least CANDIDATE_TIMEOUT_FLOOR_S, at most timeout_s.
  An edit that makes a test loop for ever is dropped in that time, not timeout_s."""
  return min(timeout_s, max(CANDIDATE_TIMEOUT_FLOOR_S, CANDIDATE_TIMEOUT_FACTOR * baseline_s))


def _candidates(repo: str, language: base.Language, kinds, seed: int) -> list[mutate.Edit]:
  """Mutations (one per line) and reverts (one per function), each in a seeded order,
  interleaved as task_builder.py interleaves its kinds."""
  edits, reverts = [], []
  for rel in base.walk_files(repo, language.ignored_dirs):
    if language.is_source_file(rel) and not language.is_test_file(rel):
      text = base.read(repo, rel)
      tests = language.inline_test_lines(text)
      if 'mutate' in kinds:
        edits += mutate.line_edits(rel, text, language.syntax, tests)
      if 'revert' in kinds:
        reverts += revert.reverts(rel, text, language.syntax, language.revert, tests)
  random.Random(seed).shuffle(reverts)
  streams = [mutate.choose(edits, seed), reverts]
  return [edit for group in itertools.zip_longest(*streams) for edit in group
          if edit is not None]


def _task_kind(edit: mutate.Edit) -> str:
  """The task kind ('mutate' or 'revert', as task_builder.KINDS) of an edit, whose own
  kind names its mutator."""
  return 'revert' if edit.kind == 'revert' else 'mutate'


def _verdict(passing: list[str], after: dict) -> tuple[list[str], list[str], str]:
  """(FAIL_TO_PASS, PASS_TO_PASS, why it is dropped or '')."""
  statuses, problems = after['statuses'], '; '.join(after['problems'])
  if after['timed_out']:
    return [], [], (f'the tests did not end within {after["seconds"]:.0f} s (the edit '
                    'hangs them; see candidate_timeout)')
  if not after['seen']:
    return [], [], f'the test run named no test ({problems or "no result in the log"})'
  fail_to_pass = [t for t in passing if statuses.get(t) == testlogs.FAILED]
  pass_to_pass = [t for t in passing if statuses.get(t) == testlogs.PASSED]
  if not fail_to_pass:
    return [], [], ('no baseline-passing test failed in both runs'
                    + (f' (the parser says: {problems})' if problems else ''))
  return fail_to_pass, pass_to_pass, ''


def build_suite(repo: str, out_path: str, language: str | None = None,
                kinds=task_builder.KINDS, max_tasks: int = 8, max_candidates: int = 40,
                seed: int = 0, timeout_s: float = 600.0, memory_mb: int = 4096,
                package=None) -> list[dict]:
  """Writes the suite to out_path (JSONL), each task's repository under `<out_path
  without .jsonl>.repos/<instance_id>` and the build report next to the suite; returns
  the records. `package` (c2jax.env.packages.Package): the checkout was fetched as that
  package; records name its exact spec as `repo` and the report says how it was made.
  A checkout that is a git repository with no uncommitted change gives its HEAD as
  each record's `base_commit`."""
  entry = registry.get(language) if language else registry.detect(repo)
  if entry.prepare is None:
    raise ValueError(f'{repo} is a {entry.name} repository, which `c2jax tasks install` '
                     'prepares and task_builder.build_suite builds from; use those.')
  if not entry.detect(repo):
    raise ValueError(f'{repo} is not a {entry.name} repository (its marker file is not '
                     'at the root); leave the language out to detect it.')
  known = tuple(k for k in task_builder.KINDS if k != 'revert' or entry.revert)
  if not kinds or set(kinds) - set(known):
    raise ValueError(f'Unknown task kind(s) {sorted(set(kinds) - set(known)) or kinds} for '
                     f'{entry.name}; choose from {known}.')
  scratch = tempfile.mkdtemp(prefix='c2jax-build-')
  try:
    tree = os.path.join(scratch, 'repo')
    shutil.copytree(repo, tree, symlinks=True, ignore=shutil.ignore_patterns('.git'))
    report = {'repo': os.path.abspath(repo), 'language': entry.name}
    if package is not None:
      report['package'] = package.to_json()
    report['prepare'] = entry.prepare(tree, timeout_s)
    report['candidates'] = []
    origin = {'name': package.name if package else os.path.basename(os.path.normpath(repo)),
              'repo': package.spec if package else os.path.basename(os.path.normpath(repo)),
              'base_commit': _clean_head(repo, timeout_s)}
    records = _build(tree, entry, out_path, report, kinds, max_tasks, max_candidates, seed,
                     timeout_s, memory_mb, origin)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  return records


def _clean_head(repo: str, timeout_s: float) -> str:
  """HEAD of a git checkout without uncommitted changes ('' otherwise)."""
  if not os.path.isdir(os.path.join(repo, '.git')):
    return ''
  def git(*args):
    return subprocess.run(['git', '-C', repo, *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
  head, status = git('rev-parse', 'HEAD'), git('status', '--porcelain')
  return head.stdout.strip() if head.returncode == 0 and not status.stdout.strip() else ''


def _build(tree, entry, out_path, report, kinds, max_tasks, max_candidates, seed,
           timeout_s, memory_mb, origin) -> list[dict]:
  name = origin['name']
  command, parser = entry.test_command(tree)
  report.update(test_command=command, test_parser=parser)
  repos_root = re.sub(r'\.jsonl$', '', out_path) + '.repos'
  records = []
  with bubblewrap.BubblewrapSandbox(tree, ro_binds=entry.toolchain_binds(),
                                    timeout_s=timeout_s, memory_mb=memory_mb) as sandbox:
    run_command = f'{entry.build_cache_env} {command}'.strip()
    baseline = _run_twice(sandbox, run_command, parser)
    passing = sorted(t for t, s in baseline['statuses'].items() if s == testlogs.PASSED)
    limit = candidate_timeout(baseline['seconds'], timeout_s)
    report['baseline'] = {
        'passed': len(passing), 'flaky': baseline['flaky'], 'problems': baseline['problems'],
        'not_passing': sorted(t for t, s in baseline['statuses'].items()
                              if s != testlogs.PASSED),
        'seconds': round(baseline['seconds'], 2), 'candidate_timeout_s': round(limit, 1)}
    if not passing:
      _write(out_path, records, report)
      raise testlogs.NoTestsSeen(
          f'No test of {report["repo"]} passed twice in a row with `{command}` (see '
          f'{report_path(out_path)}); nothing can tell a planted bug from the baseline. '
          f'The end of the last run:\n{baseline["output"][-2000:]}')
    for edit in _candidates(tree, entry, kinds, seed)[:max_candidates]:
      if len(records) >= max_tasks:
        break
      with sandbox.fork() as trial:
        trial.write_file(edit.file, edit.mutated.encode())
        after = _run_twice(trial, run_command, parser, timeout_s=limit)
      fail_to_pass, pass_to_pass, dropped = _verdict(passing, after)
      tried = {'file': edit.file, 'line': edit.line, 'kind': edit.kind,
               'function': edit.function, 'before': edit.before, 'after': edit.after,
               'flaky': after['flaky']}
      if dropped:
        report['candidates'].append({**tried, 'kept': False, 'reason': dropped})
        continue
      where = edit.function or f'L{edit.line}'
      instance_id = re.sub(r'[^A-Za-z0-9_.-]', '_',
                           f'{name}.{_task_kind(edit)}.{edit.file}.{where}.{len(records)}')
      records.append(_write_task(instance_id, origin, entry, tree, edit, fail_to_pass,
                                 pass_to_pass, repos_root, command, parser))
      report['candidates'].append({**tried, 'kept': True, 'instance_id': instance_id,
                                   'fail_to_pass': len(fail_to_pass),
                                   'pass_to_pass': len(pass_to_pass),
                                   'problems': after['problems']})
  _write(out_path, records, report)
  return records


def _write(out_path: str, records: list[dict], report: dict) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  report['tasks'] = len(records)
  with open(report_path(out_path) + '.tmp', 'w') as f:
    json.dump(report, f, indent=1)
  os.replace(report_path(out_path) + '.tmp', report_path(out_path))
  with open(out_path + '.tmp', 'w') as f:
    for record in records:
      f.write(json.dumps(record) + '\n')
  os.replace(out_path + '.tmp', out_path)


def _statement(entry, edit: mutate.Edit, fail_to_pass: list[str], command: str) -> str:
  if edit.kind == 'revert':
    return (f'Implement `{edit.function}` in `{edit.file}`; it currently '
            f'{entry.revert.describes}. The tests run with `{command}`.')
  shown = ', '.join(f'`{t}`' for t in fail_to_pass[:5])
  more = f' and {len(fail_to_pass) - 5} more' if len(fail_to_pass) > 5 else ''
  return (f'Some tests fail: {shown}{more}. The tests run with `{command}`.\n'
          f'The bug is in `{edit.file}` or the code it uses; fix the library code, '
          'do not edit the tests.')


def _write_task(instance_id, origin, entry, tree, edit, fail_to_pass, pass_to_pass,
                repos_root, command, parser) -> dict:
  task_repo = os.path.join(repos_root, instance_id)
  shutil.rmtree(task_repo, ignore_errors=True)
  shutil.copytree(tree, task_repo, symlinks=True)
  with open(os.path.join(task_repo, edit.file), 'w', encoding='utf-8') as f:
    f.write(edit.mutated)
  test_patch = ''
  for test_file in entry.test_files_for(tree, fail_to_pass):
    test_patch += _added_file_diff(base.read(tree, test_file), test_file)
    os.remove(os.path.join(task_repo, test_file))
  return {
      'instance_id': instance_id, 'repo': origin['repo'],
      'base_commit': origin['base_commit'], 'version': '',
      'created_by': _task_kind(edit), 'language': entry.name,
      'problem_statement': _statement(entry, edit, fail_to_pass, command),
      'patch': _diff(edit.mutated, edit.original, edit.file), 'test_patch': test_patch,
      'FAIL_TO_PASS': json.dumps(fail_to_pass), 'PASS_TO_PASS': json.dumps(pass_to_pass),
      'environment': '', 'test_command': command, 'test_parser': parser,
  }
