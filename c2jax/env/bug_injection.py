"""SWE-smith-style bug injection: small, typical mistakes planted in one function.

A mutator looks at one AST node of a function body and proposes replacement source for
it; the edit is spliced into the file at the node's exact span, so the diff (and the gold
patch, its reverse) touches only that expression or statement:

  flip_comparison  `a < b` -> `a >= b`, `==` -> `!=`, `in` -> `not in`, `is` -> `is not`
  off_by_one       an integer literal n -> n + 1 or n - 1
  swap_operands    `a - b` -> `b - a` (non-commutative operators)
  change_operator  `+` <-> `-`, `*` <-> `//`... (same precedence)
  flip_boolean     `and` <-> `or`
  drop_statement   an assignment / call / augmented assignment / if removed (`pass` when
                   it was the only statement of its block)

Whether a mutation makes a task is for the tests to say (task_builder.py): one no test
catches is discarded.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import os
import random
from collections.abc import Callable, Iterator

from c2jax.env import revert_restore


@dataclasses.dataclass(frozen=True)
class Mutation:
  file: str           # repository-relative
  function: str       # qualified name
  kind: str           # the mutator's name
  line: int
  original: str       # the whole file before and after
  mutated: str


_FLIP = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq,
         ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn,
         ast.NotIn: ast.In}
_SWAPPABLE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)
_OPERATOR = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
             ast.Div: ast.Mult, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
_DROPPABLE = (ast.Assign, ast.AugAssign, ast.Expr, ast.If)

Edit = tuple[ast.AST, str]  # (node whose span is replaced, replacement source; '' = drop)
Mutator = Callable[[ast.AST], list[Edit]]
MUTATORS: dict[str, Mutator] = {}


def register_mutator(name: str):
  def wrap(fn):
    MUTATORS[name] = fn
    return fn
  return wrap


@register_mutator('flip_comparison')
def _flip_comparison(node):
  if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
    new = copy.deepcopy(node)
    new.ops = [_FLIP[type(node.ops[0])]()]
    return [(node, ast.unparse(new))]
  return []


@register_mutator('off_by_one')
def _off_by_one(node):
  if (isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value < 10**6):
    return [(node, str(node.value + 1))] + ([(node, str(node.value - 1))] if node.value else [])
  return []


@register_mutator('swap_operands')
def _swap_operands(node):
  if isinstance(node, ast.BinOp) and isinstance(node.op, _SWAPPABLE):
    new = ast.BinOp(left=node.right, op=node.op, right=node.left)
    return [(node, f'({ast.unparse(new)})')]
  return []


@register_mutator('change_operator')
def _change_operator(node):
  if isinstance(node, ast.BinOp) and type(node.op) in _OPERATOR:
    new = ast.BinOp(left=node.left, op=_OPERATOR[type(node.op)](), right=node.right)
    return [(node, f'({ast.unparse(new)})')]
  return []


@register_mutator('flip_boolean')
def _flip_boolean(node):
  if isinstance(node, ast.BoolOp):
    new = ast.BoolOp(op=ast.Or() if isinstance(node.op, ast.And) else ast.And(),
                     values=node.values)
    return [(node, f'({ast.unparse(new)})')]
  return []


@register_mutator('drop_statement')
def _drop_statement(node):
  edits = []
  for field in ('body', 'orelse'):
    block = getattr(node, field, None)
    if not isinstance(block, list) or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    for statement in block:
      if isinstance(statement, _DROPPABLE) and not _is_docstring(statement):
        edits.append((statement, 'pass' if len(block) == 1 else ''))
  return edits


def _is_docstring(statement) -> bool:
  return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
          and isinstance(statement.value.value, str))


def _function_sites(function) -> Iterator[ast.AST]:
  """Nodes of a function's body (not its signature, not inside f-strings or nested defs)."""
  skip = set()
  for node in ast.walk(function):
    if isinstance(node, ast.JoinedStr) or (
        node is not function and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                   ast.Lambda, ast.ClassDef))):
      skip |= {id(n) for n in ast.walk(node)}
  # The function's own block counts for drop_statement (as a pseudo-parent).
  yield ast.If(test=ast.Constant(True), body=function.body, orelse=[])
  for statement in function.body:
    for node in ast.walk(statement):
      if id(node) not in skip:
        yield node


def _offsets(data: bytes) -> list[int]:
  starts = [0]
  for index, byte in enumerate(data):
    if byte == 0x0A:
      starts.append(index + 1)
  return starts


def apply_edit(text: str, node: ast.AST, replacement: str) -> str | None:
  """`text` with `node`'s span replaced (a statement dropped whole-line); None when the
  result does not parse or does not change the program."""
  data = text.encode()
  starts = _offsets(data)
  begin = starts[node.lineno - 1] + node.col_offset
  end = starts[node.end_lineno - 1] + node.end_col_offset
  if isinstance(node, ast.stmt):
    line_begin, line_end = starts[node.lineno - 1], (
        starts[node.end_lineno] if node.end_lineno < len(starts) else len(data))
    if data[line_begin:begin].strip() or data[end:line_end].strip():
      return None  # shares its line with other code: not a clean line edit
    indent = data[line_begin:begin]
    begin, end = line_begin, line_end
    replacement = (indent.decode() + replacement + '\n') if replacement else ''
  new = (data[:begin] + replacement.encode() + data[end:]).decode()
  try:
    if ast.dump(ast.parse(new)) == ast.dump(ast.parse(text)):
      return None
  except SyntaxError:
    return None
  return new


def mutations(repo: str, seed: int = 0, kinds: tuple[str, ...] | None = None,
              per_function: int = 1) -> list[Mutation]:
  """Up to `per_function` candidate mutations (of different kinds) per function of the
  repository's library code (tests and setup.py excluded), in a seeded random order."""
  kinds = tuple(MUTATORS) if kinds is None else kinds
  unknown = sorted(set(kinds) - set(MUTATORS))
  if unknown:
    raise ValueError(f'Unknown mutator(s) {unknown}; choose from {sorted(MUTATORS)}.')
  rng = random.Random(seed)
  found = []
  for rel, _, _, _ in sorted({(c[0], 0, 0, 0) for c in revert_restore.candidate_functions(repo)}):
    with open(os.path.join(repo, rel), encoding='utf-8') as f:
      text = f.read()
    tree = ast.parse(text)
    for qualname, function in revert_restore._functions(tree):  # pylint: disable=protected-access
      edits = [(kind, target, replacement) for site in _function_sites(function)
               for kind in kinds for target, replacement in MUTATORS[kind](site)]
      rng.shuffle(edits)
      used = set()
      for kind, node, replacement in edits:
        if kind in used:
          continue
        new = apply_edit(text, node, replacement)
        if new is not None:
          found.append(Mutation(rel, qualname, kind, node.lineno, text, new))
          used.add(kind)
          if len(used) >= per_function:
            break
  rng.shuffle(found)
  return found
