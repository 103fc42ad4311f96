"""Revert-and-restore for Go, Rust and JavaScript / TypeScript: a function's body
replaced by one statement that fails loudly, for the agent to write again.

  func Clamp(x, lo, hi int) int {          func Clamp(x, lo, hi int) int {
  \tif x < lo {                      ->    \tpanic("not implemented")
  ...                                      }

As for Python (revert_restore.py), only bodies of two or more lines are reverted (a
one-line body says too little to be worth a task), and functions whose loss breaks
everything (main, init, constructors) never are. The stub is one statement every
function accepts whatever it returns: Go's `panic(...)` is a terminating statement,
Rust's `todo!()` has type `!`, JavaScript's `throw` needs no return. A Go body that was
the only user of an import leaves it unused and the package does not build; the tests
then fail under the package's id only, and the builder drops the candidate. A Go panic
also ends its package's test binary: the tests that would have run after the failing
one are unseen on the edited tree, so they are neither FAIL_TO_PASS nor PASS_TO_PASS
(Rust and node run on past a failing test).

Functions are found by a header regex on the masked code (mutate.code_mask: comments
and strings blanked); the body is the first `{` after the header outside parentheses
and brackets (skipping Go's `interface{...}` / `struct{...}` type literals), up to its
matching `}`. A declaration without a body (`;` first: a Rust trait method) is skipped.
"""

from __future__ import annotations

import dataclasses
import re

from c2jax.env.languages import mutate


@dataclasses.dataclass(frozen=True)
class RevertSpec:
  header: str                   # a regex (multi-line mode) with a group `name`
  stub: str                     # the statement the body becomes
  describes: str                # what the stub does, for the problem statement
  never: frozenset[str] = frozenset()  # names never reverted
  min_lines: int = 2            # body lines (with code) a function needs


_TYPE_LITERAL = re.compile(r'\b(?:interface|struct)\s*$')


def _body_start(code: str, at: int) -> int | None:
  """Index of the `{` opening the body of the function whose header ends at `at`."""
  depth, k = 0, at
  while k < len(code):
    char = code[k]
    if char in '([':
      depth += 1
    elif char in ')]':
      depth -= 1
    elif depth == 0 and char == ';':
      return None
    elif depth == 0 and char == '{':
      if not _TYPE_LITERAL.search(code, max(0, k - 20), k):
        return k
      k = _matching(code, k)  # a type literal: step over it
      if k is None:
        return None
    k += 1
  return None


def _matching(code: str, open_at: int) -> int | None:
  depth = 0
  for k in range(open_at, len(code)):
    depth += {'{': 1, '}': -1}.get(code[k], 0)
    if depth == 0:
      return k
  return None


def reverts(rel: str, text: str, syntax: mutate.Syntax, spec: RevertSpec,
            skip_lines: frozenset[int] = frozenset()) -> list[mutate.Edit]:
  """One revert per function of file `rel` with a body of `spec.min_lines` or more, in
  file order; functions starting on `skip_lines` (inline tests) are left alone."""
  code = mutate.code_mask(text, syntax)
  found = []
  for match in re.finditer(spec.header, code, re.M):
    name, line = match.group('name'), code.count('\n', 0, match.start()) + 1
    if name in spec.never or line in skip_lines:
      continue
    open_at = _body_start(code, match.end())
    close_at = None if open_at is None else _matching(code, open_at)
    if close_at is None:
      continue
    body_lines = [l for l in code[open_at + 1:close_at].split('\n') if l.strip()]
    if len(body_lines) < spec.min_lines:
      continue
    header_line = text.split('\n')[line - 1]
    indent = header_line[:len(header_line) - len(header_line.lstrip())]
    inner = body_lines[0][:len(body_lines[0]) - len(body_lines[0].lstrip())] or indent + '    '
    closing_indent = text[text.rfind('\n', 0, close_at) + 1:close_at]
    closing_indent = closing_indent if not closing_indent.strip() else indent
    mutated = text[:open_at + 1] + f'\n{inner}{spec.stub}\n{closing_indent}' + text[close_at:]
    found.append(mutate.Edit(rel, line, 'revert', header_line, f'{inner}{spec.stub}',
                             text, mutated, function=name))
  return found
