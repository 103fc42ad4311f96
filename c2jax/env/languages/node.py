"""JavaScript / TypeScript packages: package.json at the root.

The runner is read from package.json's `scripts.test`: jest, vitest, mocha, tape or
node's own runner (`node --test`). The command is that script's runner call, its
arguments kept, with the reporter flag the testlogs parser reads added (a reporter or
watch flag of its own is dropped): `npx jest --json`, `npx vitest run --reporter=json`,
`npx mocha --reporter json`, `node --test --test-reporter=tap`, `npx tape 'test/*.js'`
(tape prints TAP itself, and expands its quoted globs itself). A script that does
something else first (`tsc && jest`) keeps only the runner call, and a coverage wrapper
(`nyc --reporter=lcov tape ...`, `c8 mocha`) is dropped; `npm run NAME` (yarn, pnpm) is
followed into the script it names. A plain `node FILE` (`node test` for test.js or
test/index.js) whose file requires or imports 'tape' runs as `npx tape FILE`. A script
that names no known runner is an error that says what to set. No script at all: node's
runner, which finds `*.test.js` and test/ files by itself.

Dependencies (`dependencies` / `devDependencies`) are installed at build time, `npm ci`
with a lockfile, else `npm install`, so node_modules/ travels with the tree and npx
finds the runner offline.

Test files: `*.test.*` / `*.spec.*`, `test.js` / `tests.js` (tape's usual single file),
and anything under test/, tests/ or __tests__/. jest, vitest and mocha ids begin with the
test file's path; node's TAP ids begin with the top-level test's name, and tape's ids are
a test's name: either is found as a string literal in the test files.
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
_TEST_STEMS = ('test', 'tests')  # test.js, tests.mjs: a package's one test file
# runner -> (how to call it, the flags that make the report the parser reads, parser)
_RUNNERS = {
    'jest': ('npx jest', '--json', 'jest'),
    'vitest': ('npx vitest run', '--reporter=json', 'vitest'),
    'mocha': ('npx mocha', '--reporter json', 'mocha'),
    'node': ('node --test', '--test-reporter=tap', 'tap'),
    'tape': ('npx tape', '', 'tape'),
}
# Programs that run another command under coverage: dropped, the command they run kept.
_COVERAGE_WRAPPERS = frozenset({'nyc', 'c8'})
_PACKAGE_MANAGERS = ('npm', 'yarn', 'pnpm')
# A `node FILE` script runs tape when FILE (resolved as node resolves it) loads it.
_LOADS_TAPE = re.compile(r"""\brequire\(\s*['"]tape['"]\s*\)"""
                         r"""|\bimport\s*\(\s*['"]tape['"]\s*\)"""
                         r"""|\bimport\s+(?:[\w${},*\s]+?\s+from\s*)?['"]tape['"]""")
_LOCAL_REQUIRE = re.compile(r"""\brequire\(\s*['"](\.{1,2}/[^'"]+)['"]\s*\)""")
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


def _command_words(part: str) -> list[str]:
  """The words of one command of a script without what only wraps the command:
  `FOO=bar` assignments, `npx` / `exec`, and a coverage wrapper with its own flags."""
  words = shlex.split(part)
  while words and '=' in words[0] and not words[0].startswith('-'):
    words = words[1:]
  if words and words[0] in ('npx', 'exec'):
    words = words[1:]
  if words and os.path.basename(words[0]) in _COVERAGE_WRAPPERS:
    # `nyc --reporter text tape ...`: a flag's value is no program, so the wrapped
    # command starts at the first word that names one.
    programs = {*_RUNNERS, *_PACKAGE_MANAGERS, 'npx'}
    words = next((words[i:] for i in range(1, len(words))
                  if os.path.basename(words[i]) in programs), [])
    if words and words[0] == 'npx':
      words = words[1:]
  return words


def _tape_script(repo: str, script: str) -> str | None:
  """The file `node SCRIPT` runs (SCRIPT, SCRIPT.js or SCRIPT/index.js, as node resolves
  it), repository-relative, when it loads tape, itself or through the repository's own
  files it requires (test/index.js requiring './shim', which requires tape); else None."""
  first = _resolve(repo, script)
  seen, queue = set(), [first] if first else []
  while queue and len(seen) < 50:
    rel = queue.pop(0)
    if rel in seen:
      continue
    seen.add(rel)
    text = base.read(repo, rel)
    if _LOADS_TAPE.search(text):
      return first
    for local in _LOCAL_REQUIRE.findall(text):
      found = _resolve(repo, os.path.join(os.path.dirname(rel), local))
      if found:
        queue.append(found)
  return None


def _resolve(repo: str, script: str) -> str | None:
  """SCRIPT, SCRIPT.js or SCRIPT/index.js inside the repository, as node finds it."""
  for rel in (script, script + '.js', os.path.join(script, 'index.js')):
    rel = os.path.normpath(rel)
    if rel.startswith('..') or os.path.isabs(rel):
      return None
    if os.path.isfile(os.path.join(repo, rel)):
      return rel
  return None


def _runner_call(repo: str, script: str, scripts: dict, depth: int = 0
                 ) -> tuple[str, list[str]]:
  """(runner, its arguments) of the first runner call in a test script, following
  `npm run NAME` / `yarn NAME` / `pnpm NAME` into the scripts they name."""
  for part in _SHELL_OPERATORS.split(script):
    words = _command_words(part)
    if words and words[0] in _PACKAGE_MANAGERS:
      # `npm run --silent NAME`: the manager's own flags come before the script's name.
      rest = words[2:] if words[1:2] == ['run'] else words[1:]
      while rest and rest[0].startswith('-'):
        rest = rest[1:]
      words = words[:1] + rest
    if (len(words) > 1 and words[0] in _PACKAGE_MANAGERS and words[1] in scripts
        and depth < 5):
      try:
        runner, args = _runner_call(repo, scripts[words[1]], scripts, depth + 1)
      except ValueError:
        continue
      return runner, args + [w for w in words[2:] if w != '--']
    if not words:
      continue
    program = os.path.basename(words[0])
    if program in ('jest', 'vitest', 'mocha', 'tape'):
      args = words[1:]
      if program == 'vitest' and args[:1] in (['run'], ['watch'], ['dev']):
        args = args[1:]
      return program, args
    if program == 'node' and '--test' in words:
      return 'node', [w for w in words[1:] if w != '--test']
    if (program == 'node' and len(words) == 2 and not words[1].startswith('-')
        and (test_file := _tape_script(repo, words[1]))):
      return 'tape', [test_file]
  raise ValueError(f'package.json\'s test script {script!r} runs none of '
                   f'{sorted(_RUNNERS)}; set scripts.test to a jest, vitest, mocha, tape '
                   'or `node --test` call (or `node FILE` where FILE requires tape), or '
                   'build with another --language.')


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
    runner, args = _runner_call(repo, script, scripts)
  call, flags, parser = _RUNNERS[runner]
  words = [call, flags, *map(shlex.quote, _kept(args))]
  return ' '.join(w for w in words if w), parser


def is_test_file(rel: str) -> bool:
  name = os.path.basename(rel)
  parts = rel.split(os.sep)[:-1]
  return name.endswith(_EXTENSIONS) and (
      re.search(r'\.(test|spec)\.[cm]?[jt]sx?$', name) is not None
      or os.path.splitext(name)[0] in _TEST_STEMS
      or any(p in _TEST_DIRS for p in parts))


def is_source_file(rel: str) -> bool:
  name = os.path.basename(rel)
  return (name.endswith(_EXTENSIONS) and not is_test_file(rel)
          and not name.endswith('.d.ts') and '.config.' not in name
          and not name.startswith('.'))


def _holding_literal(repo: str, test_files: list[str], text: str) -> set[str]:
  """The test files in which `text` is a string literal ('...', "..." or `...`)."""
  quoted = [q + text + q for q in ('"', "'", '`')]
  return {rel for rel in test_files if any(q in base.read(repo, rel) for q in quoted)}


def test_files_for(repo: str, test_ids: list[str]) -> list[str]:
  test_files = [rel for rel in base.walk_files(repo, IGNORED_DIRS) if is_test_file(rel)]
  files = set()
  for test_id in test_ids:
    head = test_id.split(' > ')[0]
    if head in test_files:  # jest, vitest, mocha; a crashed file under node's runner
      files.add(head)
      continue
    # A tape id is one test's name, which may itself hold ' > '; node's TAP id begins
    # with its top-level test's name.
    files.update(_holding_literal(repo, test_files, test_id)
                 or _holding_literal(repo, test_files, head))
  return sorted(files)


LANGUAGE = base.Language(
    name='node', detect=detect, prepare=prepare, test_command=test_command,
    is_test_file=is_test_file, is_source_file=is_source_file,
    test_files_for=test_files_for,
    toolchain_binds=functools.partial(toolchains.binds, 'node'), syntax=SYNTAX,
    ignored_dirs=IGNORED_DIRS, revert=REVERT)
