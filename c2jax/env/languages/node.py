"""JavaScript / TypeScript packages: package.json at the root.

The runner is read from package.json's `scripts.test`: jest, vitest, mocha or node's own
runner (`node --test`). The command is that script's runner call, its arguments kept,
with the reporter flag the testlogs parser reads added (a reporter or watch flag of its
own is dropped): `npx jest --json`, `npx vitest run --reporter=json`, `npx mocha
--reporter json`, `node --test --test-reporter=tap`. A script that does something else
first (`tsc && jest`) keeps only the runner call; one that names no known runner is an
error that says what to set; `npm run NAME` (yarn, pnpm) is followed into the script it
names. No script at all: node's runner, which finds `*.test.js`
and test/ files by itself.

Dependencies (`dependencies` / `devDependencies`) are installed at build time, `npm ci`
with a lockfile, else `npm install`, so node_modules/ travels with the tree and npx
finds the runner offline.

Test files: `*.test.*` / `*.spec.*`, and anything under test/, tests/ or __tests__/.
jest, vitest and mocha ids begin with the test file's path; node's TAP ids begin with
the top-level test's name, found as a string literal in the test files.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex

from c2jax.env import toolchains
from c2jax.env.languages import base, mutate, revert

IGNORED_DIRS = frozenset({'node_modules', 'dist', 'build', 'coverage', '.next', 'out'})
SYNTAX = mutate.Syntax(skip_line=r'import\b|export\s.*\bfrom\b|.*\brequire\(')
# Function declarations and class methods; a line that calls a function at its start
# matches too, but its `;` (or the call's own parentheses) comes before any `{`.
REVERT = revert.RevertSpec(
    header=(r'^[ \t]*(?:export\s+(?:default\s+)?)?(?:static\s+)?(?:async\s+)?'
            r'(?:function\s*\*?\s*)?(?P<name>(?!(?:if|for|while|switch|catch|function|'
            r'return|with|else|do|try|new|await|typeof|delete|void)\b)[A-Za-z_$][\w$]*)'
            r'\s*(?=\()'),
    stub="throw new Error('not implemented');", describes="throws 'not implemented'",
    never=frozenset({'constructor'}))
_EXTENSIONS = ('.js', '.mjs', '.cjs', '.jsx', '.ts', '.mts', '.cts', '.tsx')
_TEST_DIRS = ('test', 'tests', '__tests__')
# runner -> (how to call it, the flags that make the report the parser reads, parser)
_RUNNERS = {
    'jest': ('npx jest', '--json', 'jest'),
    'vitest': ('npx vitest run', '--reporter=json', 'vitest'),
    'mocha': ('npx mocha', '--reporter json', 'mocha'),
    'node': ('node --test', '--test-reporter=tap', 'tap'),
}
# Flags of a script that would fight the reporter or never end; `True`: takes a value.
_DROPPED_FLAGS = {'--reporter': True, '-R': True, '--test-reporter': True, '--watch': False,
                  '-w': False, '--json': False, '--verbose': False, '--watchAll': False,
                  '--coverage': False, '--test-reporter-destination': True}
_SHELL_OPERATORS = re.compile(r'\s*(?:&&|\|\||;|\|)\s*')


def _package(repo: str) -> dict:
  path = os.path.join(repo, 'package.json')
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f'{path} is not valid JSON ({e}); fix it to build tasks.') from e


def detect(repo: str) -> bool:
  return os.path.isfile(os.path.join(repo, 'package.json'))


def prepare(repo: str, timeout_s: float) -> list[str]:
  package = _package(repo)
  if not (package.get('dependencies') or package.get('devDependencies')) or os.path.isdir(
      os.path.join(repo, 'node_modules')):
    return []
  locked = os.path.isfile(os.path.join(repo, 'package-lock.json'))
  command = ['npm', 'ci' if locked else 'install', '--no-audit', '--no-fund']
  base.run_prepare(command, repo, timeout_s)
  return [' '.join(command)]


def _runner_call(script: str, scripts: dict, depth: int = 0) -> tuple[str, list[str]]:
  """(runner, its arguments) of the first runner call in a test script, following
  `npm run NAME` / `yarn NAME` / `pnpm NAME` into the scripts they name."""
  for part in _SHELL_OPERATORS.split(script):
    words = shlex.split(part)
    while words and '=' in words[0] and not words[0].startswith('-'):
      words = words[1:]  # FOO=bar environment assignments
    if words and words[0] in ('npx', 'exec'):
      words = words[1:]
    if words[:2] in (['npm', 'run'], ['yarn', 'run'], ['pnpm', 'run']):
      words = words[:1] + words[2:]
    if (len(words) > 1 and words[0] in ('npm', 'yarn', 'pnpm') and words[1] in scripts
        and depth < 5):
      try:
        runner, args = _runner_call(scripts[words[1]], scripts, depth + 1)
      except ValueError:
        continue
      return runner, args + [w for w in words[2:] if w != '--']
    if not words:
      continue
    program = os.path.basename(words[0])
    if program in ('jest', 'vitest', 'mocha'):
      args = words[1:]
      if program == 'vitest' and args[:1] in (['run'], ['watch'], ['dev']):
        args = args[1:]
      return program, args
    if program == 'node' and '--test' in words:
      return 'node', [w for w in words[1:] if w != '--test']
  raise ValueError(f'package.json\'s test script {script!r} runs none of '
                   f'{sorted(_RUNNERS)}; set scripts.test to a jest, vitest, mocha or '
                   '`node --test` call, or build with another --language.')


def _kept(args: list[str]) -> list[str]:
  kept, skip_next = [], False
  for arg in args:
    if skip_next:
      skip_next = False
      continue
    flag = arg.split('=', 1)[0]
    if flag in _DROPPED_FLAGS:
      skip_next = _DROPPED_FLAGS[flag] and '=' not in arg
      continue
    kept.append(arg)
  return kept


def test_command(repo: str) -> tuple[str, str]:
  scripts = _package(repo).get('scripts', {})
  script = scripts.get('test', '')
  if not script or 'no test specified' in script:
    runner, args = 'node', []
  else:
    runner, args = _runner_call(script, scripts)
  call, flags, parser = _RUNNERS[runner]
  return ' '.join([call, flags] + [shlex.quote(a) for a in _kept(args)]), parser


def is_test_file(rel: str) -> bool:
  name = os.path.basename(rel)
  parts = rel.split(os.sep)[:-1]
  return name.endswith(_EXTENSIONS) and (
      re.search(r'\.(test|spec)\.[cm]?[jt]sx?$', name) is not None
      or any(p in _TEST_DIRS for p in parts))


def is_source_file(rel: str) -> bool:
  name = os.path.basename(rel)
  return (name.endswith(_EXTENSIONS) and not is_test_file(rel)
          and not name.endswith('.d.ts') and '.config.' not in name
          and not name.startswith('.'))


def test_files_for(repo: str, test_ids: list[str]) -> list[str]:
  test_files = [rel for rel in base.walk_files(repo, IGNORED_DIRS) if is_test_file(rel)]
  files = set()
  for test_id in test_ids:
    head = test_id.split(' > ')[0]
    if head in test_files:  # jest, vitest, mocha; a crashed file under node's runner
      files.add(head)
      continue
    quoted = [q + head + q for q in ('"', "'", '`')]
    files.update(rel for rel in test_files
                 if any(q in base.read(repo, rel) for q in quoted))
  return sorted(files)


LANGUAGE = base.Language(
    name='node', detect=detect, prepare=prepare, test_command=test_command,
    is_test_file=is_test_file, is_source_file=is_source_file,
    test_files_for=test_files_for,
    toolchain_binds=functools.partial(toolchains.binds, 'node'), syntax=SYNTAX,
    ignored_dirs=IGNORED_DIRS, revert=REVERT)
