"""Environments: sandboxes, agent tools, tasks and rewards.

  make_sandbox('bubblewrap' | 'docker', repo, **limits) -> Sandbox
  Toolbox(sandbox, ToolsetConfig(...)).run_turn(model_text) -> (turn, observations)
  Task, load_jsonl / load_swebench_jsonl / load_task_folder, procgen.generate_suite,
  revert_restore.build
  grade(sandbox, task, reward='binary' | 'fraction') -> Grade
"""

from c2jax.env import procgen, revert_restore
from c2jax.env.limits import Limits
from c2jax.env.reward import REWARDS, Grade, grade, prepare
from c2jax.env.sandbox import (ExecResult, PathOutsideWorkspaceError, Sandbox, backends,
                               make_sandbox)
from c2jax.env.tasks import (Task, load_jsonl, load_swebench_jsonl, load_task_folder,
                             save_jsonl)
from c2jax.env.tools import (Observation, Toolbox, ToolsetConfig, register_tool,
                             tool_names)

__all__ = ['ExecResult', 'Grade', 'Limits', 'Observation', 'PathOutsideWorkspaceError',
           'REWARDS', 'Sandbox', 'Task', 'Toolbox', 'ToolsetConfig', 'backends', 'grade',
           'load_jsonl', 'load_swebench_jsonl', 'load_task_folder', 'make_sandbox',
           'prepare', 'procgen', 'register_tool', 'revert_restore', 'save_jsonl', 'tool_names']
