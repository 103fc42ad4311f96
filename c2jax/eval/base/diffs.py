"""Unified diffs of one file: make them (difflib) and apply them (strictly), git-compatible.

Lines are split on "\\n" only (as git does; `str.splitlines` would also split on \\r,
\\x0c, ...). A last line without a newline is marked the git way,
"\\ No newline at end of file", so a diff round-trips files that do not end in "\\n".
`apply` reads what `git log -p` / `git diff` print for one file: header lines before the
first hunk (diff --git, index, mode, rename, ---/+++) are skipped, and every context and
removed line is checked against the text, so a diff that does not fit is an error rather
than a silently wrong state.
"""

from __future__ import annotations

import difflib
import re

NO_NEWLINE = "\\ No newline at end of file"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class DiffError(ValueError):
  """A diff that cannot be applied to the given text."""


def split_lines(text: str) -> list[str]:
  """Lines with their "\\n" kept; the last one may lack it."""
  parts = text.split("\n")
  lines = [p + "\n" for p in parts[:-1]]
  if parts[-1]:
    lines.append(parts[-1])
  return lines


def make(old: str, new: str, path: str, context: int = 3) -> str:
  """The unified diff old -> new of `path` ("" when they are equal)."""
  out = []
  for line in difflib.unified_diff(split_lines(old), split_lines(new), f"a/{path}",
                                   f"b/{path}", n=context):
    if line.endswith("\n"):
      out.append(line)
    else:
      out.append(line + "\n" + NO_NEWLINE + "\n")
  return "".join(out)


def apply(old: str, diff: str) -> str:
  """`old` with the unified diff applied (see the module docstring)."""
  source = split_lines(old)
  lines = diff.split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  out: list[str] = []
  cursor = 0  # next unread line of source
  i = 0
  while i < len(lines):
    match = _HUNK.match(lines[i])
    if not match:
      if out or cursor:
        raise DiffError(f"unexpected line {i + 1} between hunks: {lines[i][:80]!r}")
      i += 1  # header
      continue
    old_start, old_count = int(match[1]), 1 if match[2] is None else int(match[2])
    new_count = 1 if match[4] is None else int(match[4])
    start = old_start - 1 if old_count else old_start
    if start < cursor or start > len(source):
      raise DiffError(f"hunk {lines[i]!r} starts at line {old_start}, outside the text "
                      f"({len(source)} lines, {cursor} already consumed).")
    out.extend(source[cursor:start])
    cursor = start
    i += 1
    seen_old = seen_new = 0
    while seen_old < old_count or seen_new < new_count or (
        i < len(lines) and lines[i].startswith("\\")):
      if i >= len(lines):
        raise DiffError(f"hunk at old line {old_start} is truncated: expected {old_count} "
                        f"old and {new_count} new lines, got {seen_old} and {seen_new}.")
      line = lines[i]
      tag, body = line[:1], line[1:]
      if tag == "\\":
        _strip_newline(out, lines[i - 1][:1])
        i += 1
        continue
      if tag in (" ", "-"):
        if cursor >= len(source) or source[cursor].rstrip("\n") != body:
          found = source[cursor] if cursor < len(source) else "end of text"
          raise DiffError(f"hunk at old line {old_start}: line {cursor + 1} should be "
                          f"{body[:80]!r} but is {found[:80]!r}.")
        if tag == " ":
          out.append(source[cursor])
          seen_new += 1
        cursor += 1
        seen_old += 1
      elif tag == "+":
        out.append(body + "\n")
        seen_new += 1
      elif line == "" and (seen_old < old_count or seen_new < new_count):
        # Some tools drop the space of an empty context line.
        if cursor >= len(source) or source[cursor] not in ("\n", ""):
          raise DiffError(f"hunk at old line {old_start}: empty context line does not "
                          f"match line {cursor + 1}.")
        out.append(source[cursor])
        cursor += 1
        seen_old += 1
        seen_new += 1
      else:
        raise DiffError(f"hunk at old line {old_start}: unexpected line {line[:80]!r}.")
      if seen_old > old_count or seen_new > new_count:
        raise DiffError(f"hunk at old line {old_start} has more lines than its header "
                        f"says ({old_count} old, {new_count} new).")
      i += 1
  out.extend(source[cursor:])
  return "".join(out)


def _strip_newline(out: list[str], tag: str) -> None:
  """Applies a "No newline at end of file" marker to the line just read (tag is its
  first character: '-' old line, '+' new line, ' ' a context line of both)."""
  if tag == "-":
    return  # the removed old line lacked a newline: nothing in `out` to change
  if not out:
    raise DiffError("a 'No newline at end of file' marker follows no line.")
  if tag == "+":
    out[-1] = out[-1].removesuffix("\n")
  elif out[-1].endswith("\n"):
    raise DiffError("a context line marked 'No newline at end of file' ends in a newline "
                    "in the text: the diff is for another version of the file.")
