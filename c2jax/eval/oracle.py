"""The scripted oracle policy: solves every task of an oracle suite through the tools.

It checks the harness itself: every suite that declares an oracle must score 100% with
it (tests/eval/test_eval_oracle.py), so a broken grader, loader or sandbox shows up as a
number below 1. Like c2jax.agent.solver (which it uses for procedural tasks), it acts only
through tool calls, so the transcript, turn and tool-call counts are real; the answer it
needs comes from task metadata the agent never sees. It is offered every registered
tool (the oracle checks the harness, not a tool list).

Plans are chosen by metadata['oracle'], else metadata['source'].
"""

from __future__ import annotations

import re
import time

from c2jax.env import reward as reward_lib
from c2jax.env import sandbox as sandbox_lib
from c2jax.agent import solver
from c2jax.env import tools as tools_lib
from c2jax.eval import episode as episode_lib
from c2jax.eval import targeted

_PLANS = {}


def _plan(*names):
  def wrap(fn):
    for name in names:
      _PLANS[name] = fn
    return fn
  return wrap


class _Session(solver.Session):
  """The solver's session, strict: a tool call of the oracle that fails is a harness bug."""

  def turn(self, content, calls):
    observations = super().turn(content, calls)
    failed = [o.output for o in observations if not o.ok]
    if failed:
      raise solver.SolverError(f"a tool call of the oracle failed: {failed}")
    return observations


@_plan("procgen")
def _procgen(toolbox, task):
  return solver.solve(task, toolbox)


def _apply_and_finish(session, payload, command, message):
  session.turn("", [("write_file", {"path": ".c2jax_oracle", "content": payload})])
  (result,) = session.turn("", [("run_shell", {"command": command})])
  if "exit code: 0" not in result.output.splitlines()[0]:
    raise solver.SolverError(f"the reference solution failed:\n{result.output[-2000:]}")
  session.turn("", [("finish", {"message": message})])
  return session.messages


@_plan("swebench", "revert_restore", "gold_patch")
def _gold_patch(toolbox, task):
  session = _Session(toolbox, task)
  return _apply_and_finish(session, task.metadata["gold_patch"],
                           "patch -p1 --forward < .c2jax_oracle && rm .c2jax_oracle",
                           "Applied the fix.")


@_plan("terminal-bench", "harbor")
def _solution_script(toolbox, task):
  if "solution_script" not in task.metadata:
    raise solver.SolverError(f"{task.id} ships no solution.sh / solution/solve.sh.")
  session = _Session(toolbox, task)
  return _apply_and_finish(session, task.metadata["solution_script"],
                           "bash .c2jax_oracle; code=$?; rm -f .c2jax_oracle; exit $code",
                           "Done.")


@_plan("eager_editing")
def _eager(toolbox, task):
  session = _Session(toolbox, task)
  question = task.metadata["question"]
  func = question["func"]
  (found,) = session.turn(f"Looking for {func}; I will not change anything.",
                          [("grep", {"pattern": rf"def {re.escape(func)}\("})])
  where = re.search(rf"^([^:\n]+):\d+: def {func}\(", found.output, re.M)
  if not where:
    raise solver.SolverError(f"grep found no definition of {func}:\n{found.output}")
  if question["kind"] == "where":
    answer = where.group(1)
  else:
    line = f"from {question['module']} import {func}; print(repr({func}({question['args']})))"
    (ran,) = session.turn("Running it as it is, without edits.", [(
        "run_shell", {"command": f"PYTHONDONTWRITEBYTECODE=1 python -c {_quote(line)}"})])
    answer = ran.output.splitlines()[-1].strip()
  if answer != task.metadata["answer"]:
    raise solver.SolverError(f"{task.id}: tools say {answer!r}, metadata says "
                             f"{task.metadata['answer']!r}.")
  session.turn("", [("finish", {"message": answer})])
  return session.messages


def _quote(text: str) -> str:
  return "'" + text.replace("'", "'\"'\"'") + "'"


@_plan("instruction_following")
def _instruction(toolbox, task):
  session = _Session(toolbox, task)
  paths = sorted({p for p, _, _ in task.metadata["solution"]})
  session.turn("Reading the file I may edit.", [("read_file", {"path": p}) for p in paths])
  session.turn("Fixing it.", [("edit_file", {"path": p, "old_string": old, "new_string": new})
                              for p, old, new in task.metadata["solution"]])
  kinds = {c["kind"] for c in task.metadata["checks"]}
  message = (targeted.DONE_PREFIX + " " if "answer_starts_with" in kinds else "") + "Fixed it."
  session.turn("", [("finish", {"message": message})])
  return session.messages


def plan_for(task):
  key = task.metadata.get("oracle") or task.metadata.get("source")
  if key not in _PLANS:
    raise solver.SolverError(f"No oracle plan for task {task.id} (source {key!r}); "
                             f"plans exist for {sorted(_PLANS)}.")
  return _PLANS[key]


class OraclePolicy:
  """Runs jobs with the scripted plans, `concurrency` sandboxes at a time."""

  def __init__(self, backend: str, concurrency: int = 1, grade_timeout_s: float = 60.0,
               disk_mb: int = 1024):
    self.backend, self.concurrency, self.disk_mb = backend, concurrency, disk_mb
    self.grade_timeout_s = grade_timeout_s
    self.label = "oracle"

  def episode(self, job: episode_lib.Job) -> episode_lib.Outcome:
    task, started = job.task, time.monotonic()
    try:
      box = sandbox_lib.make_task_sandbox(self.backend, task, disk_mb=self.disk_mb)
    except Exception as e:  # pylint: disable=broad-except
      raise episode_lib.InfraError(f"sandbox did not start: {type(e).__name__}: {e}") from e
    with box:
      reward_lib.prepare(box, task)
      toolbox = tools_lib.Toolbox(box, tools_lib.ToolsetConfig())
      try:
        messages, reason = plan_for(task)(toolbox, task), "finish"
      except solver.SolverError as e:
        messages, reason = [{"role": "assistant", "content": f"oracle failed: {e}"}], "error"
      passed, _ = reward_lib.run_hidden_tests(box, task, self.grade_timeout_s)
    calls = episode_lib.tool_call_names(messages)
    return episode_lib.Outcome(
        passed=passed, finish_reason=reason, messages=messages,
        turns=sum(m["role"] == "assistant" for m in messages), tool_calls=len(calls),
        wall_s=time.monotonic() - started)

  def run(self, jobs, on_done, should_start=None) -> None:
    episode_lib.run_in_threads(self.episode, jobs, on_done, self.concurrency, should_start)

  def close(self) -> None:
    pass
