"""Go: the event stream of `go test -json` (cmd/test2json), one JSON object a line.

  {"Action":"run","Package":"example.com/calc","Test":"TestTable/not_equal"}
  {"Action":"fail","Package":"example.com/calc","Test":"TestTable/not_equal","Elapsed":0}
  {"Action":"fail","Package":"example.com/calc","Elapsed":0.008}     (the package's end)

An id is the package and the test joined with '/' ('example.com/calc/TestTable/not_equal'
for a subtest; go writes a subtest's spaces as '_'). pass, fail and skip end a test;
pause and cont do not.

A package that does not build fails under its own path as id (its tests are never run,
so the grader counts them failed) and cuts the run short: an empty run it is not. Go
before 1.24 writes the compiler's errors and `FAIL <pkg> [build failed]` as plain text
between the JSON lines; newer go writes build-output / build-fail events and marks the
package's fail event with FailedBuild. Both are read.

A test binary that dies (os.Exit, a panic in any goroutine, go's own -timeout panic)
leaves the tests that were running without an end; they fail, and the package's first
`panic:` / `fatal error:` / `exit status` line says why. A package with events and no
end of its own was cut off: killed, or the command's timeout.
"""

from __future__ import annotations

import collections
import json
import re

from c2jax.env.testlogs import report as report_lib

_TEST_ENDS = {'pass': report_lib.PASSED, 'fail': report_lib.FAILED,
              'skip': report_lib.SKIPPED}
_BUILD_FAILED = re.compile(r'^FAIL\s+(\S+) \[(?:build|setup) failed\]')
_BUILD_HEADER = re.compile(r'^# (\S+)')
_DEATH = re.compile(r'^(panic: .*|fatal error: .*|exit status \d+)$')


class _Stream:
  """What the log says so far, package by package."""

  def __init__(self):
    self.packages: dict[str, None] = {}           # in order of first appearance
    self.ends: dict[str, str] = {}                # package -> pass / fail / skip
    self.running = collections.defaultdict(dict)  # package -> {test: None}, in run order
    self.failed_tests: set[str] = set()           # packages with a failed test
    self.deaths: dict[str, str] = {}              # package -> why its binary died
    self.build_failures: dict[str, str] = {}      # package -> the compiler's first error
    self.build_errors: dict[str, str] = {}        # import path -> its first error
    self.header = ''                              # the package of the last '# pkg' line
    self.events = 0

  def plain_line(self, line: str) -> None:
    if match := _BUILD_FAILED.match(line):
      self.build_failure(match.group(1), '')
    elif match := _BUILD_HEADER.match(line):
      self.header = match.group(1)
    elif self.header and line.strip():
      self.build_errors.setdefault(self.header, line.strip())

  def build_failure(self, package: str, failed_import: str) -> None:
    error = (self.build_errors.get(failed_import) or self.build_errors.get(package) or
             next(reversed(self.build_errors.values()), 'see the compiler output'))
    self.build_failures.setdefault(package, error)
    self.packages.setdefault(package)

  def event(self, event: dict) -> None:
    self.events += 1
    action, package, test = event['Action'], event.get('Package'), event.get('Test')
    if action in ('build-output', 'build-fail'):
      import_path = event.get('ImportPath', '').split(' ')[0]
      output = event.get('Output', '').strip()
      if action == 'build-output' and output and not output.startswith('#'):
        self.build_errors.setdefault(import_path, output)
      return
    if not package:
      return
    self.packages.setdefault(package)
    output = event.get('Output', '').rstrip('\n')
    if action == 'output':
      if match := _BUILD_FAILED.match(output):
        self.build_failure(match.group(1), '')
      elif match := _DEATH.match(output):
        self.deaths.setdefault(package, match.group(1))
    elif test and action == 'run':
      self.running[package][test] = None
    elif test and action in _TEST_ENDS:
      self.running[package].pop(test, None)
      if action == 'fail':
        self.failed_tests.add(package)
    elif not test and action in _TEST_ENDS:
      self.ends[package] = action
      if event.get('FailedBuild'):
        self.build_failure(package, event['FailedBuild'].split(' ')[0])


def parse(text: str) -> report_lib.TestReport:
  builder = report_lib.ReportBuilder('go')
  stream = _Stream()
  for line in text.splitlines():
    event = None
    if line.startswith('{'):
      try:
        event = json.loads(line)
      except json.JSONDecodeError:
        pass
    if isinstance(event, dict) and 'Action' in event:
      stream.event(event)
      if event['Action'] in _TEST_ENDS and event.get('Test'):
        builder.add(f'{event["Package"]}/{event["Test"]}', _TEST_ENDS[event['Action']])
    else:
      stream.plain_line(line)
  if not stream.events and not stream.build_failures:
    builder.cut_short('no `go test -json` events in the output: run go test with -json')
  for package in stream.packages:
    if package in stream.build_failures:
      builder.add(package, report_lib.FAILED)
      builder.cut_short(f'package {package} failed to build: '
                        f'{stream.build_failures[package]}')
      continue
    running = list(stream.running[package])
    for test in running:
      builder.add(f'{package}/{test}', report_lib.FAILED)
    during = f' while {", ".join(running)} ran' if running else ''
    end = stream.ends.get(package)
    if end is None:
      builder.cut_short(f'the log ends before package {package} finished{during}: '
                        'killed or timed out')
    elif end == 'fail' and (running or package not in stream.failed_tests):
      why = stream.deaths.get(package, 'its test binary exited')
      builder.cut_short(f'package {package} died{during or " outside its tests"}: {why}')
  return builder.report()
