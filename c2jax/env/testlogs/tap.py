"""TAP as node's test runner writes it (`node --test --test-reporter=tap`).

  # Subtest: math                       a test starts (indented 4 spaces per level)
      # Subtest: adds
      ok 1 - adds                       its result, at the same indentation
        ---                             a YAML block of details, 2 spaces further in
        duration_ms: 0.5
        ...
      1..1                              the plan of that level
  not ok 1 - math
  1..1                                  the top-level plan: the run finished

An id is the names of the enclosing tests and suites, then the test's own, joined with
' > ' ('math > division > by zero'); suites are reported too. `# SKIP` and `# TODO` are
skipped whatever the result (a TODO test may fail by design). Names are unescaped (node
writes '#' as '\\#').

Node runs each test file in its own process. When that process dies before its tests
end (process.exit, a signal), node reports the file itself as a failed test whose
details hold `exitCode` or `signal`: the file's id is its path, and the run is cut
short. A log without the top-level plan line was cut off (killed or timed out); a test
that started (`# Subtest:`) and never reported fails.

Newer nodes print the 'spec' reporter by default even when not on a terminal; a task
using this parser must ask for TAP explicitly.
"""

from __future__ import annotations

import re

from c2jax.env.testlogs import report as report_lib

_INDENT = 4
_SUBTEST = re.compile(r'^( *)# Subtest: (.*)$')
_RESULT = re.compile(r'^( *)(ok|not ok) \d+(?: - (.*))?$')
_PLAN = re.compile(r'^1\.\.(\d+)')
_CRASH_DETAIL = re.compile(r"^ *(exitCode|signal): '?([^'~\s]+)'?\s*$")
_ESCAPES = {'n': '\n', 't': '\t', 'r': '\r', 'b': '\b', 'f': '\f', 'v': '\v'}


def _split_directive(description: str) -> tuple[str, str]:
  """(name, directive) of `name # SKIP reason`: the first unescaped '#' starts it."""
  name, i = [], 0
  while i < len(description):
    char = description[i]
    if char == '\\' and i + 1 < len(description):
      name.append(_ESCAPES.get(description[i + 1], description[i + 1]))
      i += 2
      continue
    if char == '#':
      return ''.join(name).rstrip(), description[i + 1:].strip()
    name.append(char)
    i += 1
  return ''.join(name), ''


def _status(result: str, directive: str) -> str:
  if directive.upper().startswith(('SKIP', 'TODO')):  # TAP: any case, '# Skipped' too
    return report_lib.SKIPPED
  return report_lib.PASSED if result == 'ok' else report_lib.FAILED


def parse(text: str) -> report_lib.TestReport:
  builder = report_lib.ReportBuilder('tap')
  names: list[str] = []       # the enclosing tests of the current line, by depth
  started: list[str] = []     # ids begun with '# Subtest:' and not yet reported
  plan, top_results = None, 0
  crashed_id = None           # the last failed result, while its YAML block is read
  seen_tap = False
  for line in text.splitlines():
    if match := _SUBTEST.match(line):
      depth = len(match.group(1)) // _INDENT
      names[depth:] = [_split_directive(match.group(2))[0]]
      started.append(' > '.join(names))
      seen_tap = True
    elif match := _RESULT.match(line):
      depth = len(match.group(1)) // _INDENT
      name, directive = _split_directive(match.group(3) or '')
      test_id = ' > '.join(names[:depth] + [name])
      status = _status(match.group(2), directive)
      builder.add(report_lib.workspace_relative(test_id), status)
      if test_id in started:
        started.remove(test_id)
      del names[depth:]
      top_results += depth == 0
      crashed_id = test_id if status == report_lib.FAILED else None
      seen_tap = True
    elif crashed_id and (match := _CRASH_DETAIL.match(line)):
      what = 'exited with code' if match.group(1) == 'exitCode' else 'was killed by'
      builder.cut_short(f'{report_lib.workspace_relative(crashed_id)}: its process '
                        f'{what} {match.group(2)} before its tests finished')
    elif match := _PLAN.match(line):
      plan = int(match.group(1))
    elif line.startswith('Bail out!'):
      builder.cut_short(f'the run bailed out: {line}')
    elif line.startswith('TAP version'):
      seen_tap = True
  for test_id in reversed(started):
    builder.add(report_lib.workspace_relative(test_id), report_lib.FAILED)
    builder.cut_short(f'{report_lib.workspace_relative(test_id)} started and never '
                      'finished')
  if not seen_tap:
    builder.cut_short('no TAP output found: run node --test with --test-reporter=tap '
                      '(newer nodes print the spec reporter by default)')
  elif plan is None:
    builder.cut_short('the log ends before the final plan line (1..N): the run was '
                      'killed or timed out')
  elif top_results < plan:
    builder.cut_short(f'the plan announced {plan} top-level tests, the log reports '
                      f'{top_results}')
  return builder.report()
