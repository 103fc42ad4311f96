"""Bug injection mutators: each edit touches only its node and changes the program."""

import ast
import difflib

import pytest

from c2jax.env import bug_injection
from env_testlib import write_tree

_SOURCE = '''def f(xs, n):
  """Docstring stays."""
  total = 0
  for i in range(1, n):
    if xs[i] > 0 and i != 3:
      total += xs[i] - xs[i - 1]
  return total * 2
'''


def _edits(kind):
  tree = ast.parse(_SOURCE)
  function = tree.body[0]
  out = []
  for site in bug_injection._function_sites(function):
    for node, replacement in bug_injection.MUTATORS[kind](site):
      new = bug_injection.apply_edit(_SOURCE, node, replacement)
      if new is not None:
        out.append(new)
  return out


def _changed_lines(new):
  return [l for l in difflib.ndiff(_SOURCE.splitlines(), new.splitlines())
          if l.startswith(('-', '+'))]


@pytest.mark.parametrize('kind, expected', [
    ('flip_comparison', '    if xs[i] <= 0 and i != 3:'),
    ('off_by_one', '  for i in range(2, n):'),
    ('swap_operands', '      total += (xs[i - 1] - xs[i])'),
    ('change_operator', '  return (total // 2)'),
    ('flip_boolean', '    if (xs[i] > 0 or i != 3):'),
])
def test_each_mutator_edits_one_line_in_place(kind, expected):
  edits = _edits(kind)
  assert edits, kind
  for new in edits:
    changed = _changed_lines(new)
    assert len(changed) == 2, changed  # one line out, one line in
    compile(new, 'f.py', 'exec')
  assert any(('+ ' + expected) in _changed_lines(new) for new in edits), edits


def test_drop_statement_removes_whole_lines_and_keeps_blocks_valid():
  edits = _edits('drop_statement')
  assert edits
  for new in edits:
    compile(new, 'f.py', 'exec')
    assert '"""Docstring stays."""' in new
  # The if's only statement becomes `pass`; the function's assignment disappears.
  assert any('      pass\n' in new and 'total +=' not in new for new in edits)
  assert any('total = 0' not in new for new in edits)


def test_mutations_one_per_function_skip_tests_and_are_seeded(tmp_path):
  repo = write_tree(tmp_path / 'r', {
      'pkg/__init__.py': '', 'pkg/core.py': _SOURCE + '\n\n' + _SOURCE.replace('def f', 'def g'),
      'tests/test_core.py': 'def test_x():\n  assert 1 < 2\n  assert 2 > 1\n'})
  first = bug_injection.mutations(repo, seed=3)
  assert sorted(m.function for m in first) == ['f', 'g']
  assert {m.file for m in first} == {'pkg/core.py'}
  assert [(m.function, m.mutated) for m in first] == [
      (m.function, m.mutated) for m in bug_injection.mutations(repo, seed=3)]
  two = bug_injection.mutations(repo, seed=3, per_function=2)
  assert sorted(m.function for m in two) == ['f', 'f', 'g', 'g']
  assert all(len({m.kind for m in two if m.function == f}) == 2 for f in 'fg')
  with pytest.raises(ValueError, match='Unknown mutator'):
    bug_injection.mutations(repo, kinds=('typo',))
