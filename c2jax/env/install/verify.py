"""Verification of an install: the repository's tests are collected and enough pass.

Runs the plan's test command in a sandbox that starts from the environment layer exactly
as a rollout's does (no network). Tests that fail, error or are skipped are the
repository's unrunnable tests: recorded in the summary, never hidden.
"""

from __future__ import annotations

import dataclasses
import re

from c2jax.env import bubblewrap

_RESULT_LINE = re.compile(r'^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S+)', re.M)
_SKIPPED_LINE = re.compile(r'^SKIPPED \[\d+\] (\S+?):?\d*:', re.M)
_ANSI = re.compile(r'\x1b\[[0-9;]*m')


@dataclasses.dataclass
class Verification:
  passed: list[str]
  failed: list[str]                # FAILED and ERROR ids (an ERROR of a file: collection)
  skipped: int
  exit_code: int
  output: str

  @property
  def collected(self) -> int:
    return len(self.passed) + len(self.failed)

  @property
  def pass_fraction(self) -> float:
    return len(self.passed) / self.collected if self.collected else 0.0

  def summary(self) -> dict:
    return {'collected': self.collected, 'passed': len(self.passed),
            'failed': len(self.failed), 'skipped': self.skipped,
            'pass_fraction': round(self.pass_fraction, 4), 'exit_code': self.exit_code,
            'unrunnable': self.failed[:200]}


def parse(output: str, exit_code: int) -> Verification:
  output = _ANSI.sub('', output)
  statuses: dict[str, str] = {}
  for status, test in _RESULT_LINE.findall(output):
    statuses[test] = status
  passed = sorted(t for t, s in statuses.items() if s in ('PASSED', 'XFAIL', 'XPASS'))
  failed = sorted(t for t, s in statuses.items() if s in ('FAILED', 'ERROR'))
  return Verification(passed, failed, len(_SKIPPED_LINE.findall(output)), exit_code, output)


def run_tests(repo: str, layer: str, test_command: str, timeout_s: float,
              memory_mb: int, max_processes: int) -> Verification:
  with bubblewrap.BubblewrapSandbox(repo, env_layer=layer, timeout_s=timeout_s,
                                    memory_mb=memory_mb,
                                    max_processes=max_processes) as box:
    result = box.run_shell(test_command.replace('{tests}', ''))
  output = result.text + ('\n[c2jax: the test run timed out]' if result.timed_out else '')
  return parse(output, result.exit_code)
