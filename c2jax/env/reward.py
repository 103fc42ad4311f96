"""Rewards from hidden tests, run in a fork of the agent's sandbox after it finishes.

The agent's workspace is forked, the hidden test files and test patch go into the fork
only, and the test command runs there: the agent never sees the tests, and the live
sandbox stays as the agent left it. The task's log parser (testlogs, by the task's
test_parser) reads the per-test statuses; a listed test passes only when its status is
'passed', so a test the log never names (a crash, a timeout) fails.

A run in which the parser sees no test at all is one of two things. If the command
timed out or failed (any exit status but 0, and 126 / 127, the shell's "not executable"
and "command not found"), the agent's code can have caused it: a hang, a process.exit()
in the code under test, or a crash kills jest, mocha or vitest before their JSON report,
so every listed test fails (else an agent could dodge a 0 by breaking the runner).
Otherwise (exit 0, or the runner itself missing) the task or its environment is broken,
not the model: testlogs.NoTestsSeen, never graded (an infrastructure error). Single-script
tasks (Terminal-Bench, Harbor, procgen) keep their rule: with the 'pytest' parser and no
result line, the command's exit status is the verdict for every listed test.
"""

import dataclasses
import shlex

from c2jax.env import sandbox as sandbox_lib
from c2jax.env import tasks as tasks_lib
from c2jax.env import testlogs

# Exit statuses of a run with no test seen that say the environment is broken: success,
# and the shell's "not executable" / "command not found".
_RUNNER_MISSING = (0, 126, 127)


@dataclasses.dataclass(frozen=True)
class Grade:
  reward: float
  passed: dict  # test id -> bool
  output: str


def prepare(sandbox: sandbox_lib.Sandbox, task: tasks_lib.Task) -> None:
  """Runs the task's setup commands; raises if one fails (the task is broken)."""
  for command in task.setup_commands:
    result = sandbox.run_shell(command)
    if result.exit_code != 0:
      raise RuntimeError(f'Setup command {command!r} of task {task.id} failed '
                         f'({result.exit_code}):\n{result.text[-2000:]}')


def run_hidden_tests(sandbox: sandbox_lib.Sandbox, task: tasks_lib.Task,
                     timeout_s: float | None = None) -> tuple[dict, str]:
  """Per-test pass/fail of FAIL_TO_PASS + PASS_TO_PASS, in a fork of `sandbox`, and the
  test command's output. Raises testlogs.NoTestsSeen when the output names no test."""
  tests = task.fail_to_pass + task.pass_to_pass
  with sandbox.fork() as grader:
    for path, content in task.hidden_files.items():
      grader.write_file(path, content.encode())
    if task.test_patch:
      grader.write_file('.c2jax_test.patch', task.test_patch.encode())
      applied = grader.run_shell('patch -p1 --forward < .c2jax_test.patch && '
                                 'rm .c2jax_test.patch')
      if applied.exit_code != 0:
        return {t: False for t in tests}, 'test patch did not apply:\n' + applied.text
    # replace, not format: shell commands often contain braces of their own.
    command = task.test_command.replace('{tests}', ' '.join(shlex.quote(t) for t in tests))
    result = grader.run_shell(command, timeout_s=timeout_s)
  report = testlogs.parse(task.test_parser, result.text)
  if not report.statuses and task.test_parser == 'pytest':
    # A single script: its exit status is the verdict for every listed test.
    return {t: result.exit_code == 0 and not result.timed_out for t in tests}, result.text
  if not report.statuses and (result.timed_out or result.exit_code not in _RUNNER_MISSING):
    return {t: False for t in tests}, result.text  # the run broke: see the docstring
  testlogs.require_tests(report, task.test_parser, result.text)
  return {t: report.statuses.get(t) == testlogs.PASSED for t in tests}, result.text


def binary_reward(task, passed) -> float:
  return float(all(passed.values()))


def fraction_reward(task, passed) -> float:
  """Share of FAIL_TO_PASS passing, only if no PASS_TO_PASS test broke."""
  if not all(passed[t] for t in task.pass_to_pass):
    return 0.0
  return sum(passed[t] for t in task.fail_to_pass) / len(task.fail_to_pass)


REWARDS = {'binary': binary_reward, 'fraction': fraction_reward}


def grade(sandbox: sandbox_lib.Sandbox, task: tasks_lib.Task, reward: str = 'binary',
          timeout_s: float | None = None) -> Grade:
  if reward not in REWARDS:
    raise ValueError(f'Unknown reward {reward!r}; choose one of {sorted(REWARDS)}.')
  passed, output = run_hidden_tests(sandbox, task, timeout_s)
  return Grade(REWARDS[reward](task, passed), passed, output)
