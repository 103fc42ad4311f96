"""TAP as tape writes it (`tape 'test/**/*.js'`): one stream for all the files it runs.

  TAP version 13
  # adds                                a test starts: '# ' and its name
  ok 1 one and one                      its assertions, numbered across the whole run
  not ok 2 should be strictly equal
    ---                                 a failed assertion's YAML block, 2 spaces in
      operator: equal
    ...
  # SKIP skipped test                   {skip: true}: no assertions follow
  # TODO later                          {todo: true}: its assertions end in '# TODO'
  ok 3 not this one # SKIP              t.skip() of one assertion
  not ok 4 test exited without ending: adds    written when the process exits first

  1..4                                  the plan (assertions, not tests): the run ended
  # tests 4                             the summary: # pass N, # fail N or # ok

An id is the test's name as tape prints it. Nested `t.test` subtests print their own
'# name' line and nothing says whose subtests they are: a subtest's id is its own name,
and a parent's id covers only the assertions it makes itself. A name given several tests
in one run (in different files, or subtests of different parents) is one id that keeps
its worst status (report.py's rule): a pass elsewhere must not hide a failure.

A test fails when one of its assertions fails, and passes when it ended without a failed
assertion (a test without assertions that called t.end() passes). A test declared SKIP
or TODO is skipped whatever its assertions did (tape counts a failed TODO assertion as a
pass), as is a test whose every assertion is `# SKIP` or `# TODO`; `# SKIP` / `# TODO`
assertions beside passing ones leave the test passed. tape writes a skipped test's reason
after its name with a space: that test's id is both. tape 5's `test.skip(name, fn)`
prints nothing at all, so such a test is absent from the report.

A log without the plan was cut short: the process crashed (an exception thrown inside or
outside a test ends it: tape catches neither), called process.exit with a failing code,
or was killed or timed out. The test running then (the last '# name') fails. When the
process exits with code 0 before its tests end, tape itself reports each test that never
ended (`not ok N test exited without ending: NAME`) and closes the plan; those tests fail
and the run is cut short all the same.

Limits of the format: t.comment('text') also prints '# text', which reads as a test of
that name taking the assertions after it; so does console output beginning '# '.
"""

from __future__ import annotations

import dataclasses
import re

from c2jax.env.testlogs import report as report_lib

_TEST = re.compile(r'^# (?:(SKIP|TODO) )?(.*)$')
_RESULT = re.compile(r'^(ok|not ok) \d+(?: (.*))?$')
# tape appends ' # SKIP [reason]' or ' # TODO [reason]' to an assertion's name.
_DIRECTIVE = re.compile(r'^(.*?) ?# (SKIP|TODO)(?: .*)?$')
_EXITED = 'test exited without ending: '
_PLAN = re.compile(r'^1\.\.(\d+)$')


@dataclasses.dataclass
class _Test:
  """One '# name' line and what its assertions said."""
  name: str
  declared: str = ''  # 'SKIP' or 'TODO' from the name line
  passed: int = 0
  failed: int = 0
  skipped: int = 0

  def status(self) -> str:
    if self.declared or (self.skipped and not self.passed and not self.failed):
      return report_lib.SKIPPED
    return report_lib.FAILED if self.failed else report_lib.PASSED


def _assertion(description: str) -> tuple[str, str]:
  """(name, 'SKIP' / 'TODO' / '') of an assertion's description."""
  if match := _DIRECTIVE.match(description):
    return match.group(1), match.group(2)
  return description, ''


def _cut(builder: report_lib.ReportBuilder, current: _Test | None) -> None:
  """A stream ended without its plan: the test running then (if any) fails."""
  if current is not None:
    builder.add(current.name, report_lib.FAILED)
    builder.cut_short(f'{current.name} started and never finished')
  builder.cut_short('the log ends before the final plan line (1..N): the run crashed, '
                    'exited early, was killed or timed out')


def parse(text: str) -> report_lib.TestReport:
  builder = report_lib.ReportBuilder('tape')
  current: _Test | None = None  # the test whose assertions the next lines are
  plan, assertions, seen_tap = None, 0, False
  # Every line tape writes in a YAML block is indented, and so never matches below.
  for line in text.splitlines():
    if line.startswith('TAP version'):  # a stream starts: its own plan must come
      if seen_tap and plan is None:
        _cut(builder, current)
        current = None
      seen_tap, plan, assertions = True, None, 0
    elif not seen_tap or plan is not None:
      continue  # output before tape started; the summary after the plan ('# pass 3')
    elif match := _PLAN.match(line):
      plan = int(match.group(1))
      if current is not None:
        builder.add(current.name, current.status())
        current = None
      if assertions < plan:
        builder.cut_short(f'the plan announced {plan} assertions, the log reports '
                          f'{assertions}')
    elif match := _TEST.match(line):
      if current is not None:
        builder.add(current.name, current.status())
      current = _Test(match.group(2), declared=match.group(1) or '')
    elif match := _RESULT.match(line):
      assertions += 1
      name, directive = _assertion(match.group(2) or '')
      if name.startswith(_EXITED):
        unended = name[len(_EXITED):]
        builder.add(unended, report_lib.SKIPPED if directive else report_lib.FAILED)
        builder.cut_short(f'{unended} never ended: the process exited first')
      elif current is None:
        builder.note(f'an assertion before any test, not counted: {line}')
      elif directive:
        current.skipped += 1
      elif match.group(1) == 'ok':
        current.passed += 1
      else:
        current.failed += 1
  if not seen_tap:
    builder.cut_short("no TAP output found (no 'TAP version' line): the tests did not "
                      'run under tape, or crashed before it started')
  elif plan is None:
    _cut(builder, current)
  return builder.report()
