"""JavaScript runners' JSON reports: jest `--json`, vitest `--reporter=json`, mocha
`--reporter json`.

Each runner prints one JSON object when the whole run ends, usually after (and sometimes
between) console output of its own and of the tests: the object is found in the text,
not assumed to be all of it. No object means the run never reached its end (a test
called process.exit, the run was killed or timed out, or the reporter flag is missing),
and nothing can be said about any test.

Ids:
  jest, vitest: the test file relative to the workdir, the enclosing describe blocks,
    the test's title, joined with ' > ' ('test/math.test.js > math > division > divides').
  mocha: the file and mocha's fullTitle (its suites and title joined with spaces, as
    mocha reports it), joined with ' > ' ('test/math.spec.js > math division divides').
A test file that failed to run at all (a syntax error, a missing import) has its path as
id and fails; a failed mocha hook is reported under mocha's own title for it ('db
"before all" hook for "reads"') and the tests it guarded never run. jest's 'pending' is
test.skip; vitest's is a test without a result, whose worker died (vitest intercepts
process.exit, but a signal kills the worker, and the report still says success): it
never finished, and fails.
"""

from __future__ import annotations

import json

from c2jax.env.testlogs import report as report_lib

_JEST_STATUSES = {'passed': report_lib.PASSED, 'failed': report_lib.FAILED,
                  'pending': report_lib.SKIPPED, 'skipped': report_lib.SKIPPED,
                  'todo': report_lib.SKIPPED, 'disabled': report_lib.SKIPPED}
# vitest writes 'skipped' for test.skip and 'pending' for a test that was queued or
# running and has no result: its worker died (the report then still says success), or
# the run bailed out. Such a test never finished.
_UNFINISHED = 'unfinished'
_VITEST_STATUSES = {**_JEST_STATUSES, 'pending': _UNFINISHED}
_MOCHA_LISTS = {'passes': report_lib.PASSED, 'pending': report_lib.SKIPPED,
                'failures': report_lib.FAILED}
_HOW_TO_REPORT = {'jest': 'jest --json', 'vitest': 'vitest run --reporter=json',
                  'mocha': 'mocha --reporter json'}


def _json_objects(text: str, required_keys: frozenset[str]):
  """Every JSON object in `text` that has all of `required_keys`, in order.

  Tries each '{' as the start of an object and skips past the objects it decodes, so
  the cost stays near one pass over the text even when the console output holds braces.
  """
  decoder = json.JSONDecoder()
  position = text.find('{')
  while position >= 0:
    try:
      value, end = decoder.raw_decode(text, position)
    except json.JSONDecodeError:
      position = text.find('{', position + 1)
      continue
    if isinstance(value, dict) and required_keys <= value.keys():
      yield value
    position = text.find('{', end)


def _gist(message: str) -> str:
  """The first two lines of a runner's error message ('Test suite failed to run / Cannot
  find module ...')."""
  lines = [line.strip(' ●') for line in message.splitlines() if line.strip(' ●')]
  return ' / '.join(lines[:2]) if lines else 'no message'


def _parse_jest_shape(text: str, parser: str, statuses: dict[str, str]
                      ) -> report_lib.TestReport:
  """jest's report format, which vitest's json reporter also writes."""
  builder = report_lib.ReportBuilder(parser)
  reports = list(_json_objects(text, frozenset({'testResults', 'numTotalTests'})))
  if not reports:
    builder.cut_short('no JSON report (an object with "testResults") in the output: the '
                      'run crashed, was killed or timed out before its end, or the '
                      f'command lacks `{_HOW_TO_REPORT[parser]}`')
  for report in reports:
    if report.get('wasInterrupted'):
      builder.cut_short('the run was interrupted')
    for file_result in report['testResults']:
      path = report_lib.workspace_relative(file_result.get('name', ''))
      assertions = file_result.get('assertionResults', [])
      if file_result.get('status') == 'failed' and not assertions:
        builder.add(path, report_lib.FAILED)
        builder.cut_short(f'{path} failed to run: '
                          f'{_gist(file_result.get("message", ""))}')
      unfinished = 0
      for assertion in assertions:
        test_id = ' > '.join([path, *assertion.get('ancestorTitles', []),
                              assertion['title']])
        status = statuses.get(assertion.get('status'))
        if status is None:
          builder.note(f'{test_id}: unknown status {assertion.get("status")!r}, '
                       'counted as failed')
        unfinished += status == _UNFINISHED
        builder.add(test_id, report_lib.FAILED if status in (None, _UNFINISHED) else status)
      if unfinished:
        builder.cut_short(f'{path}: {unfinished} of its tests never finished (the '
                          'worker running them died, or the run bailed out)')
  return builder.report()


def parse_jest(text: str) -> report_lib.TestReport:
  return _parse_jest_shape(text, 'jest', _JEST_STATUSES)


def parse_vitest(text: str) -> report_lib.TestReport:
  return _parse_jest_shape(text, 'vitest', _VITEST_STATUSES)


def parse_mocha(text: str) -> report_lib.TestReport:
  builder = report_lib.ReportBuilder('mocha')
  reports = list(_json_objects(text, frozenset({'stats', *_MOCHA_LISTS})))
  if not reports:
    builder.cut_short('no JSON report (an object with "stats", "passes", "failures") in '
                      'the output: the run crashed, was killed or timed out before its '
                      f'end, or the command lacks `{_HOW_TO_REPORT["mocha"]}`')
  for report in reports:
    for key, status in _MOCHA_LISTS.items():
      for test in report[key]:
        title = test['fullTitle']
        test_id = (f'{report_lib.workspace_relative(test["file"])} > {title}'
                   if test.get('file') else title)
        builder.add(test_id, status)
        if status == report_lib.FAILED and '" hook' in test.get('title', ''):
          builder.note(f'{test_id} failed: the tests it guards did not run')
  return builder.report()
