"""pytest: the `-rA` short test summary and the `-v` per-test lines; ids are node ids.

  -rA:  PASSED tests/test_x.py::test_a
        FAILED tests/test_x.py::test_b[1-2] - assert 1 == 2
        ERROR tests/test_x.py                (a file that failed to collect)
        SKIPPED [2] tests/test_x.py:17: reason
  -v:   tests/test_x.py::test_a PASSED                     [ 50%]
        tests/test_x.py::test_c SKIPPED (reason)           [ 75%]
  xdist -v: [gw0] [ 50%] PASSED tests/test_x.py::test_a

`-rA` names a skipped test only by where it was skipped (`file:line`, one line for
several tests skipped at the same place): that location is its id. A node id may hold
spaces inside its parameter brackets (`test_eq[x y]`); it ends where its brackets close.

The run is complete when pytest printed its final counts line (`2 failed, 3 passed in
0.1s`, `no tests ran in 0.01s`) and no `!!! ... !!!` banner said it stopped early
(`Interrupted: 1 error during collection`, `stopping after 1 failures`, a
KeyboardInterrupt). Under `-v` each test's id is printed before it runs: when the log
ends without the counts line, the last test that started and never reported is the one
that crashed or hung, and fails.
"""

from __future__ import annotations

import re

from c2jax.env.testlogs import report as report_lib

_WORDS = {'PASSED': report_lib.PASSED, 'XFAIL': report_lib.PASSED,
          'FAILED': report_lib.FAILED, 'ERROR': report_lib.FAILED,
          'XPASS': report_lib.FAILED, 'SKIPPED': report_lib.SKIPPED}
_SUMMARY_SKIP = re.compile(r'^SKIPPED \[\d+\] (.+?:\d+): ')
_XDIST_PREFIX = re.compile(r'^\[gw\d+\] \[[\s\d%/]+\] ')
_COUNT = (r'\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?|'
          r'rerun|subtests passed|subtests failed)')
_FINAL_COUNTS = re.compile(rf'^=*\s*(?:no tests ran|{_COUNT}(?:, {_COUNT})*) in '
                           r'[\d.]+s(?: \([\d:]+\))?\s*=*$')
_STOPPED = re.compile(r'^!{3,} (.+?) !{3,}$')
_NODE_ID_START = re.compile(r'^[^\s:\[<]+\.\w+::')  # a file with its extension, then '::'


def _leading_node_id(text: str) -> tuple[str, str]:
  """(node id, the rest) of a line that starts with a node id.

  The id is the first word, carried on through spaces while a parameter bracket it
  opened is still open: `t.py::test_eq[x y] PASSED` -> ('t.py::test_eq[x y]', 'PASSED').
  """
  depth = 0
  for i, char in enumerate(text):
    if char == '[':
      depth += 1
    elif char == ']':
      depth = max(depth - 1, 0)
    elif char == ' ' and depth == 0:
      return text[:i], text[i + 1:]
  return text, ''


def parse(text: str) -> report_lib.TestReport:
  builder = report_lib.ReportBuilder('pytest')
  finished = False
  last_started = None  # under -v: the last test whose id was printed
  for line in text.splitlines():
    line = _XDIST_PREFIX.sub('', line.rstrip())
    word, _, rest = line.partition(' ')
    if word == 'SKIPPED' and (match := _SUMMARY_SKIP.match(line)):
      builder.add(match.group(1), report_lib.SKIPPED)
    elif word in _WORDS and rest:
      test_id, _ = _leading_node_id(rest)
      builder.add(test_id, _WORDS[word])
    elif _FINAL_COUNTS.match(line):
      finished = True
    elif match := _STOPPED.match(line):
      builder.cut_short(f'stopped early: {match.group(1)}')
    elif _NODE_ID_START.match(word):
      test_id, rest = _leading_node_id(line)
      status = rest.split(' ', 1)[0]
      if status in _WORDS:
        builder.add(test_id, _WORDS[status])
      else:
        last_started = test_id
  if not finished:
    builder.cut_short('the log ends before pytest\'s final counts line: pytest crashed, '
                      'was killed or timed out')
    if last_started and last_started not in builder.statuses:
      builder.add(last_started, report_lib.FAILED)
      builder.cut_short(f'{last_started} started and never finished')
  return builder.report()
