"""Per-test results from the logs of test runners, one parser per runner family (as
SWE-bench has one per repository family).

  parse('go', log) -> TestReport(statuses={'example.com/x/TestAdd': 'passed', ...},
                                 complete=True, problems=[])
  require_tests(report, 'go', log)   # raises NoTestsSeen when the run named no test

Parsers (PARSERS, by the name a task's `test_parser` gives):
  pytest  pytest -rA summary lines and -v lines                    (pytest_log.py)
  tap     node --test --test-reporter=tap                          (tap.py)
  tape    tape 'test/**/*.js': TAP, '# name' lines then assertions (tape.py)
  jest    jest --json                                              (json_reports.py)
  vitest  vitest run --reporter=json                               (json_reports.py)
  mocha   mocha --reporter json                                    (json_reports.py)
  go      go test -json                                            (go.py)
  cargo   cargo test (libtest's default output), every binary      (cargo.py)

Statuses are 'passed', 'failed' or 'skipped' (report.py says how each runner's words
map, and why a repeated id keeps its worst status). `complete` is False when the log
shows that part of the run never finished (a crash, a timeout, a build error); the
module of each parser says how it can tell. Every parser is tested on real logs of its
runner: tests/fixtures/testlogs/, made by tools/fixtures/make_testlogs.py.
"""

from __future__ import annotations

import re
from typing import Callable

from c2jax.env.testlogs import cargo, go, json_reports, pytest_log, tap, tape
from c2jax.env.testlogs.report import (FAILED, PASSED, SKIPPED, STATUSES, NoTestsSeen,
                                       TestReport, require_tests)

# Each takes the log as plain text: parse() removes terminal colours and carriage returns.
PARSERS: dict[str, Callable[[str], TestReport]] = {
    'pytest': pytest_log.parse,
    'tap': tap.parse,
    'tape': tape.parse,
    'jest': json_reports.parse_jest,
    'vitest': json_reports.parse_vitest,
    'mocha': json_reports.parse_mocha,
    'go': go.parse,
    'cargo': cargo.parse,
}

_TERMINAL_CODES = re.compile(r'\x1b\[[0-9;?]*[A-Za-z]')


def parse(parser_name: str, text: str) -> TestReport:
  """The report of parser `parser_name` on a test command's output `text`."""
  if parser_name not in PARSERS:
    raise ValueError(f'Unknown test log parser {parser_name!r}; known parsers: '
                     f'{sorted(PARSERS)}. Set the task\'s test_parser to one of them.')
  text = _TERMINAL_CODES.sub('', text).replace('\r\n', '\n').replace('\r', '\n')
  return PARSERS[parser_name](text)


__all__ = ['FAILED', 'NoTestsSeen', 'PARSERS', 'PASSED', 'SKIPPED', 'STATUSES',
           'TestReport', 'parse', 'require_tests']
