"""Procedurally generated Python repositories with one planted bug family each.

Difficulty grows from a one-line fix to multi-file changes, in patterns a tiny model can
learn:
  0 constant:   a module constant has a wrong value and the prompt names the file, the
                constant and the right value (an RL warm-start family: the fix is copied
                from the prompt);
  1 operator:   one arithmetic operator is wrong in one function;
  2 condition:  a comparison and a constant are wrong in one function (two lines);
  3 two_files:  a helper in one module and its caller in another are both wrong;
  4 missing:    a module calls a helper that does not exist yet; add it.
Every task's hidden tests check values computed from the correct code at generation
time. metadata['solution'] lists the gold edits (path, old, new) the scripted solver
(solver.py) applies after finding them through the tools; the agent never sees it.

Hidden tests are pytest files. Difficulty 0's also run as a plain script
(`python -m tests.test_<module>`) that prints pytest-style `PASSED <id>` / `FAILED <id>`
lines, so grading keeps per-test verdicts without pytest's start-up cost (it runs once
per RL rollout).
"""

import os
import random

from c2jax.env import tasks as tasks_lib

_NOUNS = ('price', 'score', 'weight', 'count', 'speed', 'level', 'budget', 'length',
          'volume', 'rating', 'margin', 'offset')
_MODULES = ('calc', 'metrics', 'stats', 'units', 'ledger', 'geometry', 'inventory')
_OPS = {'+': lambda a, b: a + b, '-': lambda a, b: a - b, '*': lambda a, b: a * b}
_CONSTANT_PREFIXES = ('MAX', 'MIN', 'BASE', 'STEP', 'DEFAULT')
CATEGORIES = {0: 'constant', 1: 'operator', 2: 'condition', 3: 'two_files', 4: 'missing'}


def _pairs(rng, n=4):
  return [(rng.randint(-20, 20), rng.randint(1, 20)) for _ in range(n)]


def _test_file(module, func, cases, expected) -> str:
  lines = [f'from pkg.{module} import {func}', '', '']
  for i, (args, want) in enumerate(zip(cases, expected)):
    call = ', '.join(map(repr, args))
    lines += [f'def test_{func}_{i}():', f'    assert {func}({call}) == {want!r}', '', '']
  return '\n'.join(lines).rstrip() + '\n'


def _script_footer(path) -> str:
  # Runs the file's tests without pytest and prints the lines reward.run_hidden_tests
  # reads; a module that fails to import exits non-zero before printing any.
  return (f'\n\nif __name__ == "__main__":\n'
          f'    import sys\n'
          f'    failed = 0\n'
          f'    for name, test in list(globals().items()):\n'
          f'        if name.startswith("test_"):\n'
          f'            try:\n'
          f'                test()\n'
          f'                print("PASSED {path}::" + name)\n'
          f'            except Exception as e:\n'
          f'                failed += 1\n'
          f'                print("FAILED {path}::" + name + " - " + repr(e))\n'
          f'    sys.exit(1 if failed else 0)\n')


def _write_repo(root, files):
  for path, text in files.items():
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, 'w') as f:
      f.write(text)


def _filler(rng, module) -> str:
  # A correct neighbour function, so the bug is not the only code in the file.
  noun = rng.choice(_NOUNS)
  return f'\n\ndef describe_{noun}(value):\n    return "{module}:" + str(value)\n'


def _constant(rng, module):
  noun = rng.choice(_NOUNS)
  name = f'{rng.choice(_CONSTANT_PREFIXES)}_{noun.upper()}'
  func = f'apply_{noun}'
  # Single digits: one token each, so a small model can learn to copy them.
  good, bad = rng.sample(range(2, 10), 2)
  good_line, bad_line = f'{name} = {good}\n', f'{name} = {bad}\n'
  source = (bad_line + f'\n\ndef {func}(value):\n    return value + {name}\n'
            + _filler(rng, module))
  # Distinct values: every case sees the constant, so every case fails until it is fixed.
  cases = [(v,) for v in rng.sample(range(-20, 21), 4)]
  expected = [v + good for (v,) in cases]
  buggy = [v + bad for (v,) in cases]
  prompt = f'In pkg/{module}.py, {name} is {bad} but it should be {good}. Fix it.'
  return ({f'pkg/{module}.py': source}, {module: (func, cases, expected, buggy)},
          prompt, [(f'pkg/{module}.py', bad_line, good_line)])


def _operator(rng, module):
  noun = rng.choice(_NOUNS)
  func = f'combine_{noun}'
  good, bad = rng.sample(sorted(_OPS), 2)
  good_line, bad_line = f'    return a {good} b\n', f'    return a {bad} b\n'
  source = f'def {func}(a, b):\n' + bad_line + _filler(rng, module)
  cases = _pairs(rng)
  expected = [_OPS[good](a, b) for a, b in cases]
  buggy = [_OPS[bad](a, b) for a, b in cases]
  prompt = f'{func} gives wrong results; it should compute a {good} b. Please fix it.'
  return ({f'pkg/{module}.py': source}, {module: (func, cases, expected, buggy)},
          prompt, [(f'pkg/{module}.py', bad_line, good_line)])


def _condition(rng, module):
  noun = rng.choice(_NOUNS)
  func = f'cap_{noun}'
  limit, wrong_limit = rng.randint(5, 50), rng.randint(51, 99)
  good_if, bad_if = '    if value > limit:\n', '    if value < limit:\n'
  good_k, bad_k = f'LIMIT = {limit}\n', f'LIMIT = {wrong_limit}\n'
  source = (bad_k + f'\n\ndef {func}(value, limit=None):\n    limit = LIMIT if limit is '
            'None else limit\n' + bad_if + '        return limit\n    return value\n'
            + _filler(rng, module))
  cases = [(v,) for v in rng.sample(range(-10, 120), 4)]
  expected = [min(v, limit) for (v,) in cases]
  buggy = [max(v, wrong_limit) for (v,) in cases]
  prompt = (f'{func} should cap {noun} values at {limit} (values above it become '
            f'{limit}), but it does not. Fix it.')
  return ({f'pkg/{module}.py': source}, {module: (func, cases, expected, buggy)},
          prompt, [(f'pkg/{module}.py', bad_k, good_k), (f'pkg/{module}.py', bad_if, good_if)])


def _two_files(rng, module):
  noun = rng.choice(_NOUNS)
  factor, wrong = rng.randint(2, 9), rng.randint(10, 19)
  helper, func = f'scale_{noun}', f'total_{noun}'
  good_h, bad_h = f'    return value * {factor}\n', f'    return value * {wrong}\n'
  good_s, bad_s = '    return sum(scale(v) for v in values)\n', (
      '    return sum(scale(v) for v in values[1:])\n')
  files = {
      'pkg/helpers.py': f'def {helper}(value):\n' + bad_h + _filler(rng, 'helpers'),
      f'pkg/{module}.py': f'from pkg.helpers import {helper} as scale\n\n\n'
                          f'def {func}(values):\n' + bad_s,
  }
  cases = [([rng.randint(0, 9) for _ in range(rng.randint(2, 5))],) for _ in range(4)]
  expected = [sum(v * factor for v in vs) for (vs,) in cases]
  buggy = [sum(v * wrong for v in vs[1:]) for (vs,) in cases]
  prompt = (f'{func} should be the sum of every {noun} scaled by {factor}; the numbers '
            'are off. Fix it.')
  return (files, {module: (func, cases, expected, buggy)}, prompt,
          [('pkg/helpers.py', bad_h, good_h), (f'pkg/{module}.py', bad_s, good_s)])


def _missing(rng, module):
  noun = rng.choice(_NOUNS)
  helper, func = f'clip_{noun}', f'clean_{noun}s'
  low, high = rng.randint(-5, 0), rng.randint(5, 15)
  anchor = 'def describe'
  helpers = _filler(rng, 'helpers').lstrip('\n')
  files = {
      'pkg/helpers.py': helpers,
      f'pkg/{module}.py': f'from pkg import helpers\n\n\ndef {func}(values):\n'
                          f'    return [helpers.{helper}(v) for v in values]\n',
  }
  new_func = (f'def {helper}(value):\n    return max({low}, min({high}, value))\n\n\n')
  cases = [([rng.randint(-15, 25) for _ in range(3)],) for _ in range(4)]
  expected = [[max(low, min(high, v)) for v in vs] for (vs,) in cases]
  prompt = (f'{func} crashes: helpers.{helper} is missing. Add it; it should clip a '
            f'value into [{low}, {high}].')
  buggy = [None] * len(cases)  # the call raises AttributeError
  return files, {module: (func, cases, expected, buggy)}, prompt, [
      ('pkg/helpers.py', anchor, new_func + anchor)]


_BUILDERS = {0: _constant, 1: _operator, 2: _condition, 3: _two_files, 4: _missing}
# What generate_suite cycles through unless told otherwise: the bug-hunting families
# (difficulty 0 states its own fix, so it is opt-in).
DEFAULT_DIFFICULTIES = (1, 2, 3, 4)
_SCRIPT_TESTED = frozenset({0})


def generate(out_dir: str, seed: int, difficulty: int) -> tasks_lib.Task:
  """Writes one repository under out_dir/<task id>/ and returns its task."""
  if difficulty not in _BUILDERS:
    raise ValueError(f'difficulty must be one of {sorted(_BUILDERS)}, got {difficulty}.')
  rng = random.Random(seed * 10 + difficulty)
  module = rng.choice(_MODULES)
  files, tested, prompt, solution = _BUILDERS[difficulty](rng, module)
  task_id = f'procgen-d{difficulty}-{seed:05d}'
  repo = os.path.join(out_dir, task_id)
  _write_repo(repo, dict(files, **{'pkg/__init__.py': ''}))
  hidden, fail_to_pass, pass_to_pass = {}, [], []
  for mod, (func, cases, expected, buggy) in tested.items():
    path = f'tests/test_{mod}.py'
    hidden[path] = _test_file(mod, func, cases, expected)
    if difficulty in _SCRIPT_TESTED:
      hidden[path] += _script_footer(path)
    for i, (want, got) in enumerate(zip(expected, buggy)):
      # A case the bug happens not to change already passes: it guards, not grades.
      (pass_to_pass if want == got else fail_to_pass).append(f'{path}::test_{func}_{i}')
  if difficulty in _SCRIPT_TESTED:
    # One tested module per task in these families: one script runs all its tests.
    (mod,) = tested
    test_command = f'python -m tests.test_{mod}'
  else:
    test_command = tasks_lib.PYTEST_COMMAND
  return tasks_lib.Task(
      id=task_id, repo=repo, prompt=prompt, test_command=test_command,
      fail_to_pass=fail_to_pass,
      pass_to_pass=pass_to_pass, hidden_files=hidden,
      metadata={'source': 'procgen', 'category': CATEGORIES[difficulty],
                'difficulty': difficulty, 'solution': solution})


def generate_suite(out_dir: str, count: int, seed: int = 0,
                   difficulties: tuple[int, ...] = DEFAULT_DIFFICULTIES
                   ) -> list[tasks_lib.Task]:
  """`count` tasks with seeds seed, seed + 1, ..., cycling through `difficulties`."""
  unknown = sorted(set(difficulties) - set(_BUILDERS))
  if not difficulties or unknown:
    raise ValueError(f'difficulties must be a non-empty selection of {sorted(_BUILDERS)}, '
                     f'got {tuple(difficulties)}.')
  return [generate(out_dir, seed + i, difficulties[i % len(difficulties)])
          for i in range(count)]
