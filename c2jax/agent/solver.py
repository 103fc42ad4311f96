"""Scripted reference solver for procedurally generated tasks; emits SFT traces.

It works only through the tool protocol, like a model would: it writes turns as text,
the Toolbox parses and runs them, and it reads the observations to decide what to do
next (where the code lives, whether the exact text to replace is there, whether the
code now runs). The gold edits in task.metadata['solution'] tell it *what* to change,
the tools tell it *where*. The transcript is an OpenAI-style message list.

A plan per task category: bug hunts search, read, edit, check and finish (five turns);
a 'constant' task's prompt states the file, the constant and both values, so its
shortest honest path is one edit taken from the prompt, then finish (two turns).
"""

import json
import re

from c2jax.agent import config as agent_config
from c2jax.agent import prompt as prompt_lib
from c2jax.toolcalls import protocol
from c2jax.env import tasks as tasks_lib
from c2jax.env import tools as tools_lib


class SolverError(RuntimeError):
  """The scripted solver could not follow its plan (a tool result surprised it)."""


def _numbered_to_text(observation: str) -> str:
  """read_file output back to file text (drops the line numbers)."""
  lines = [line.split('\t', 1)[1] if '\t' in line else ''
           for line in observation.splitlines() if not line.startswith('[...')]
  return '\n'.join(lines) + '\n'


class Session:
  """Sends turns through the toolbox and records the transcript."""

  def __init__(self, toolbox, task):
    self.toolbox = toolbox
    # The system message the agent loop sends (c2jax.agent.loop), for the same tools.
    system = prompt_lib.system_message(agent_config.SYSTEM_PROMPT, toolbox.specs())
    self.messages = prompt_lib.initial_messages(system, task.prompt)
    self.turns = 0

  def turn(self, content: str, calls: list[tuple[str, dict]]):
    text = protocol.render_turn(content, calls)
    turn, observations = self.toolbox.run_turn(text)
    self.messages += protocol.to_openai_messages(turn, observations, self.turns)
    self.turns += 1
    return observations


def _symbols(task) -> list[str]:
  return re.findall(r'\b([a-z]+_[a-z_]+)\b', task.prompt)


_STATED_FIX = re.compile(r'In (\S+), ([A-Z][A-Z_]*) is (-?\d+) but it should be (-?\d+)\.')
CONSTANT_FINISH_MESSAGE = 'Fixed the constant.'


def _solve_stated_fix(session: Session, task: tasks_lib.Task) -> None:
  """One edit read off the prompt (checked against the gold edit), then finish."""
  stated = _STATED_FIX.search(task.prompt)
  if not stated:
    raise SolverError(f'{task.id}: the prompt does not state a constant fix:\n{task.prompt}')
  path, name, old, new = stated.groups()
  edit = (path, f'{name} = {old}\n', f'{name} = {new}\n')
  if [tuple(e) for e in task.metadata['solution']] != [edit]:
    raise SolverError(f'{task.id}: the prompt says {edit} but the gold edit is '
                      f'{task.metadata["solution"]}; the generator and the prompt disagree.')
  (result,) = session.turn('', [('edit_file', dict(zip(('path', 'old_string', 'new_string'),
                                                      edit)))])
  if not result.ok:
    raise SolverError(f'{task.id}: the edit failed: {result.output}')
  session.turn('', [('finish', {'message': CONSTANT_FINISH_MESSAGE})])


def _solve_by_search(session: Session, task: tasks_lib.Task) -> None:
  """Finds the code with grep, reads it, applies the gold edits, checks it imports."""
  solution = task.metadata['solution']
  symbol = _symbols(task)[0]
  (found,) = session.turn(f'I will find where {symbol} is defined and used.',
                          [('grep', {'pattern': re.escape(symbol)})])
  definition = re.search(rf'^([^:\n]+):\d+: def {symbol}\(', found.output, re.M)
  if not found.ok or not definition:
    raise SolverError(f'grep found no definition of {symbol}:\n{found.output}')
  module = definition.group(1)
  paths = sorted({path for path, _, _ in solution})
  reads = session.turn('Let me read the relevant file' + ('s.' if len(paths) > 1 else '.'),
                       [('read_file', {'path': p}) for p in paths])
  contents = {p: _numbered_to_text(o.output) for p, o in zip(paths, reads)}
  edits = []
  for path, old, new in solution:
    if contents[path].count(old) != 1:
      raise SolverError(f'Expected exactly one {old!r} in {path}; read:\n{contents[path]}')
    edits.append(('edit_file', {'path': path, 'old_string': old, 'new_string': new}))
  results = session.turn(f'The bug is clear; fixing it with {len(edits)} edit(s).', edits)
  if not all(r.ok for r in results):
    raise SolverError(f'An edit failed: {[r.output for r in results if not r.ok]}')
  import_line = f'from {module[:-3].replace("/", ".")} import {symbol}; print({symbol})'
  (check,) = session.turn('Checking that the module still imports.',
                          [('run_shell', {'command': f'python -c {json.dumps(import_line)}'})])
  if 'exit code: 0' not in check.output:
    raise SolverError(f'The fixed code does not import:\n{check.output}')
  session.turn('', [('finish', {'message': f'Fixed {symbol} (edited {", ".join(paths)}).'})])


_PLANS = {'constant': _solve_stated_fix}


def solve(task: tasks_lib.Task, toolbox: tools_lib.Toolbox) -> list[dict]:
  """Fixes `task` in the toolbox's sandbox; returns the transcript."""
  session = Session(toolbox, task)
  _PLANS.get(task.metadata.get('category'), _solve_by_search)(session, task)
  if not toolbox.finished:
    raise SolverError('finish was not accepted.')
  return session.messages


def solve_suite(suite: list[tasks_lib.Task], backend: str = 'bubblewrap',
                tools: tuple[str, ...] = tools_lib.ToolsetConfig.tools) -> list[dict]:
  """Solves every task in its own sandbox and returns SFT traces, one dict per task.

  `tools` are the tools offered (and listed in the system message), as the agent's
  config.agent.tools would; the traces then match what the agent loop shows the model.
  Each task is checked: its hidden tests fail before and pass after the solver's edits;
  a task the solver cannot solve is an error (the generator is broken).
  """
  from c2jax.env import reward
  from c2jax.env import sandbox as sandbox_lib

  traces = []
  for task in suite:
    with sandbox_lib.make_task_sandbox(backend, task) as box:
      before = reward.grade(box, task)
      if before.reward != 0.0:
        raise SolverError(f'{task.id}: hidden tests pass before any fix; the generator '
                          f'planted no bug.\n{before.output[-1000:]}')
      messages = solve(task, tools_lib.Toolbox(box, tools_lib.ToolsetConfig(tools=tuple(tools))))
      after = reward.grade(box, task)
      if after.reward != 1.0:
        raise SolverError(f'{task.id}: the scripted solver did not solve it.\n'
                          f'{after.output[-2000:]}')
    traces.append({'task_id': task.id, 'reward': after.reward, 'messages': messages})
  return traces
