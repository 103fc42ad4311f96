"""Procedurally generated Python repositories with one planted bug family each.

Difficulty grows from a one-line fix to multi-file changes, in patterns a tiny model can
learn:
  1 operator:   one arithmetic operator is wrong in one function;
  2 condition:  a comparison and a constant are wrong in one function (two lines);
  3 two_files:  a helper in one module and its caller in another are both wrong;
  4 missing:    a module calls a helper that does not exist yet; add it.
Every task's hidden tests check values computed from the correct code at generation
time. metadata['solution'] lists the gold edits (path, old, new) the scripted solver
(solver.py) applies after finding them through the tools; the agent never sees it.
"""

import os
import random

from c2jax.env import tasks as tasks_lib

_NOUNS = ('price', 'score', 'weight', 'count', 'speed', 'level', 'budget', 'length',
          'volume', 'rating', 'margin', 'offset')
_MODULES = ('calc', 'metrics', 'stats', 'units', 'ledger', 'geometry', 'inventory')
_OPS = {'+': lambda a, b: a + b, '-': lambda a, b: a - b, '*': lambda a, b: a * b}
CATEGORIES = {1: 'operator', 2: 'condition', 3: 'two_files', 4: 'missing'}


def _pairs(rng, n=4):
  return [(rng.randint(-20, 20), rng.randint(1, 20)) for _ in range(n)]


def _test_file(module, func, cases, expected) -> str:
  lines = [f'from pkg.{module} import {func}', '', '']
  for i, (args, want) in enumerate(zip(cases, expected)):
    call = ', '.join(map(repr, args))
    lines += [f'def test_{func}_{i}():', f'    assert {func}({call}) == {want!r}', '', '']
  return '\n'.join(lines).rstrip() + '\n'


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


_BUILDERS = {1: _operator, 2: _condition, 3: _two_files, 4: _missing}


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
    for i, (want, got) in enumerate(zip(expected, buggy)):
      # A case the bug happens not to change already passes: it guards, not grades.
      (pass_to_pass if want == got else fail_to_pass).append(f'{path}::test_{func}_{i}')
  return tasks_lib.Task(
      id=task_id, repo=repo, prompt=prompt, fail_to_pass=fail_to_pass,
      pass_to_pass=pass_to_pass, hidden_files=hidden,
      metadata={'source': 'procgen', 'category': CATEGORIES[difficulty],
                'difficulty': difficulty, 'solution': solution})


def generate_suite(out_dir: str, count: int, seed: int = 0) -> list[tasks_lib.Task]:
  """`count` tasks cycling through the difficulties."""
  return [generate(out_dir, seed + i, 1 + i % len(_BUILDERS)) for i in range(count)]
