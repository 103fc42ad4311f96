"""What every log parser returns (TestReport), and the builder the parsers share.

Statuses are three: 'passed', 'failed', 'skipped'. A runner's own words map onto them by
one rule, "did the test do what its author declared it should": an expected failure that
failed (pytest XFAIL) passed, and one that unexpectedly passed (XPASS) failed, as
SWE-bench grades them and as today's pytest grading already did; what the author marked
not to be run or not written yet (skip, ignore, pending, todo, TAP's TODO) is skipped.
An error (a fixture, hook or whole file that broke, a package that did not build) is a
failure of the id the runner gave it.

A test reported more than once (reruns, a teardown error after a pass) keeps its worst
status, failed > skipped > passed: a flaky pass must not hide a failure.
"""

from __future__ import annotations

import dataclasses

from c2jax.env import sandbox_base

PASSED, FAILED, SKIPPED = 'passed', 'failed', 'skipped'
STATUSES = (PASSED, FAILED, SKIPPED)
_BADNESS = {PASSED: 0, SKIPPED: 1, FAILED: 2}
_TAIL_LINES = 20


@dataclasses.dataclass(frozen=True)
class TestReport:
  """Per-test statuses read from one log.

  `complete` is False when the log shows that part of the run never finished: a test
  process that crashed or was killed, a timeout, a test that started and never ended, a
  file, package or binary that failed to build or collect, a reporter's output that never
  came. Tests the log does not name are simply absent: the grader counts an absent id as
  not passed. `problems` says, in words, what was cut short or odd.
  """
  __test__ = False  # not a pytest test class, whatever its name

  statuses: dict[str, str]
  complete: bool
  problems: list[str]


class NoTestsSeen(RuntimeError):
  """A run in which the parser found no test at all.

  An empty run is an error of the task or its environment (a wrong test command, a
  missing reporter flag, no test files collected), never a pass and never the model's
  failure: the grader reports it as an infrastructure error.
  """


class ReportBuilder:
  """Collects statuses (the worse one wins on a repeated id) and problems."""

  def __init__(self, parser: str):
    self.parser = parser
    self.statuses: dict[str, str] = {}
    self.problems: list[str] = []
    self.complete = True

  def add(self, test_id: str, status: str) -> None:
    if status not in _BADNESS:
      raise ValueError(f'{self.parser}: status {status!r} of {test_id!r} is not one of '
                       f'{STATUSES}.')
    old = self.statuses.get(test_id)
    if old is None or _BADNESS[status] > _BADNESS[old]:
      self.statuses[test_id] = status

  def note(self, problem: str) -> None:
    """Something worth knowing that did not stop the run (e.g. a failed mocha hook)."""
    text = f'{self.parser}: {problem}'
    if text not in self.problems:
      self.problems.append(text)

  def cut_short(self, problem: str) -> None:
    """Part of the run never finished; `problem` says which and why."""
    self.complete = False
    self.note(problem)

  def report(self) -> TestReport:
    return TestReport(dict(self.statuses), self.complete, list(self.problems))


def workspace_relative(path: str) -> str:
  """`path` relative to the sandbox's workdir when it is under it, else unchanged.

  Runners that report test files by absolute path (jest, vitest, mocha, node --test) then
  give the same ids in every sandbox, and the ids match the repository's own paths.
  """
  prefix = sandbox_base.WORKDIR.rstrip('/') + '/'
  return path[len(prefix):] if path.startswith(prefix) else path


def require_tests(report: TestReport, parser_name: str, log_tail: str) -> TestReport:
  """`report`, or NoTestsSeen when it names no test. `log_tail` is the log, or at least
  its end: the message quotes its last lines, where a runner says why nothing ran."""
  if report.statuses:
    return report
  tail = '\n'.join(log_tail.rstrip('\n').splitlines()[-_TAIL_LINES:])
  found = ''.join(f'\n  {problem}' for problem in report.problems)
  raise NoTestsSeen(
      f'The {parser_name!r} log parser found no test result in the output of the test '
      f'command{":" + found if found else "."}\nAn empty run is an error of the task or '
      'its environment (the test command, its reporter flags, the test files it '
      f'collects), not a result: check them. The last {_TAIL_LINES} lines of the '
      f'output:\n{tail}')
