"""Language-agnostic bug injection: operator-level edits of one source line.

The AST mutators of bug_injection.py need a parser per language; this one needs only to
know where comments and string literals are (Syntax), so Go, Rust and JavaScript /
TypeScript share it. Each candidate changes one token on one line:

  flip_comparison  ` < ` -> ` >= `, ` <= ` -> ` > `, ` == ` -> ` != `, ` === ` -> ` !== `...
  change_operator  ` + ` <-> ` - `
  flip_logical     ` && ` <-> ` || `
  flip_boolean     `true` <-> `false`
  off_by_one       an integer literal n -> n + 1 or n - 1

Conservative on purpose, since no parser checks the result: an operator is mutated only
with a space on each side (`a < b`, never the generics of `Vec<u8>`, a unary minus,
`+=`, `->` or `=>`), `&&` / `||` only after an operand (not Rust's `move || ...`
closures), literals only when they stand alone (not `1.5`, `0x1f`, `x2`, `1e3`), and
never on the lines Syntax.skip_line names (imports, package clauses, attributes).
Comments and string literals (line and block comments, quoted strings, JS template and
Go raw strings, Rust's char literals but not its lifetimes) are masked before matching,
across lines.
An edit that does not compile fails every test, and the builder drops it.
"""

from __future__ import annotations

import dataclasses
import random
import re


@dataclasses.dataclass(frozen=True)
class Syntax:
  """Where a language's comments and literals start; enough to mask them."""
  line_comment: str = '//'
  block_comment: tuple[str, str] | None = ('/*', '*/')
  # Quote characters whose literal runs to the same unescaped quote (may span lines).
  quotes: tuple[str, ...] = ('"', "'", '`')
  # Quote characters of literals that never hold an escape (Go's raw strings).
  raw_quotes: tuple[str, ...] = ()
  # A regex for a one-character literal; when set, "'" starts a literal only where it
  # matches (Rust: `'a'` is a char, `'a` in `&'a str` a lifetime).
  char_literal: str | None = None
  # A (masked, left-stripped) line matching this is left alone: imports, package
  # clauses, attributes.
  skip_line: str = r'(import|package)\b'


@dataclasses.dataclass(frozen=True)
class Edit:
  """One candidate edit of one file (a mutation here, or a revert: revert.py)."""
  file: str       # repository-relative
  line: int       # 1-based: the edited line, or a reverted function's first line
  kind: str
  before: str     # that line before and after, without its newline (a revert: the
  after: str      #   function's header and the statement its body became)
  original: str   # the whole file before and after
  mutated: str
  function: str = ''  # a reverted function's name


_COMPARISONS = {'<': '>=', '<=': '>', '>': '<=', '>=': '<', '==': '!=', '!=': '==',
                '===': '!==', '!==': '==='}
_OPERATORS = {'+': '-', '-': '+'}
_LOGICAL = {'&&': '||', '||': '&&'}
_BOOLEANS = {'true': 'false', 'false': 'true'}
_SPACED = re.compile(r'(?<=\s)(===|!==|<=|>=|==|!=|&&|\|\||<|>|\+|-)(?=\s)')
_WORD = re.compile(r'\b(true|false)\b')
_INTEGER = re.compile(r'(?<![\w.])(\d+)(?![\w.])')
_OPERAND_END = re.compile(r'[\w)\]"\'`]')
_MAX_LITERAL = 10**6


def code_mask(text: str, syntax: Syntax) -> str:
  """`text` with every character of a comment or string literal replaced by a space
  (newlines kept), so positions still match."""
  out = list(text)
  i, n = 0, len(text)

  def blank(start, end):
    for k in range(start, min(end, n)):
      if out[k] != '\n':
        out[k] = ' '

  char_re = re.compile(syntax.char_literal) if syntax.char_literal else None
  while i < n:
    if text.startswith(syntax.line_comment, i):
      end = text.find('\n', i)
      end = n if end < 0 else end
      blank(i, end)
      i = end
    elif syntax.block_comment and text.startswith(syntax.block_comment[0], i):
      end = text.find(syntax.block_comment[1], i + len(syntax.block_comment[0]))
      end = n if end < 0 else end + len(syntax.block_comment[1])
      blank(i, end)
      i = end
    elif text[i] in syntax.raw_quotes:
      end = text.find(text[i], i + 1)
      end = n if end < 0 else end + 1
      blank(i, end)
      i = end
    elif text[i] == "'" and char_re is not None:
      match = char_re.match(text, i)
      if match:
        blank(i, match.end())
        i = match.end()
      else:
        i += 1  # a lifetime or label: code
    elif text[i] in syntax.quotes:
      quote, k = text[i], i + 1
      while k < n and text[k] != quote:
        k += 2 if text[k] == '\\' else 1
      blank(i, k + 1)
      i = k + 1
    else:
      i += 1
  return ''.join(out)


def _line_edits(code: str, line: str) -> list[tuple[str, int, int, str]]:
  """(kind, start, end, replacement) of every candidate on one masked line."""
  edits = []
  for match in _SPACED.finditer(code):
    token = match.group(1)
    if token in _COMPARISONS:
      edits.append(('flip_comparison', match.start(), match.end(), _COMPARISONS[token]))
    elif token in _OPERATORS:
      edits.append(('change_operator', match.start(), match.end(), _OPERATORS[token]))
    else:
      before = line[:match.start()].rstrip()
      if before and _OPERAND_END.match(before[-1]) and not before.endswith('move'):
        edits.append(('flip_logical', match.start(), match.end(), _LOGICAL[token]))
  for match in _WORD.finditer(code):
    edits.append(('flip_boolean', match.start(), match.end(), _BOOLEANS[match.group(1)]))
  for match in _INTEGER.finditer(code):
    value = int(match.group(1))
    if value >= _MAX_LITERAL or (len(match.group(1)) > 1 and match.group(1)[0] == '0'):
      continue
    edits.append(('off_by_one', match.start(), match.end(), str(value + 1)))
    if value:
      edits.append(('off_by_one', match.start(), match.end(), str(value - 1)))
  return edits


def line_edits(rel: str, text: str, syntax: Syntax,
               skip_lines: frozenset[int] = frozenset()) -> list[Edit]:
  """Every candidate edit of file `rel` (content `text`), in file order; lines in
  `skip_lines` (1-based: e.g. a Rust `#[cfg(test)]` module) are left alone."""
  masked = code_mask(text, syntax).split('\n')
  lines = text.split('\n')
  skip = re.compile(syntax.skip_line)
  found = []
  for number, (code, line) in enumerate(zip(masked, lines), 1):
    if number in skip_lines or not code.strip() or skip.match(code.lstrip()):
      continue
    for kind, start, end, replacement in _line_edits(code, line):
      after = line[:start] + replacement + line[end:]
      mutated = '\n'.join(lines[:number - 1] + [after] + lines[number:])
      found.append(Edit(rel, number, kind, line, after, text, mutated))
  return found


def choose(edits: list[Edit], seed: int, per_line: int = 1) -> list[Edit]:
  """Up to `per_line` edits (of different kinds) per line, in a seeded random order:
  the same seed gives the same candidates in the same order."""
  rng = random.Random(seed)
  by_line: dict[tuple[str, int], list[Edit]] = {}
  for edit in edits:
    by_line.setdefault((edit.file, edit.line), []).append(edit)
  chosen = []
  for key in sorted(by_line):
    options = by_line[key]
    rng.shuffle(options)
    kinds = set()
    for edit in options:
      if edit.kind not in kinds and len(kinds) < per_line:
        kinds.add(edit.kind)
        chosen.append(edit)
  rng.shuffle(chosen)
  return chosen
