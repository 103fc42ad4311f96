"""Graders beyond hidden tests: transcript checks and the workspace-unchanged script.

Transcript checks read the finished episode (its final answer, its tool calls): a task
lists them in `metadata['checks']` as {'id', 'kind', ...arguments} and each becomes a
`check::<id>` entry of the episode's passed dict. Kinds live in a registry.

Workspace checks run inside the grading sandbox like any hidden test:
`workspace_check_files(repo, allowed)` returns a hidden script (plus its manifest of file
hashes taken when the task is built) that prints `PASSED workspace::unchanged` when no
file outside `allowed` was created, changed or deleted. Caches (__pycache__, *.pyc)
are ignored: running code is not editing it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable

from c2jax.eval import episode as episode_lib

CHECK_PREFIX = "check::"
WORKSPACE_TEST = "workspace::unchanged"
SCRIPT_PATH = ".c2jax_eval/check_workspace.py"

_CHECKS: dict[str, Callable[..., bool]] = {}


def register_check(kind: str):
  def wrap(fn):
    _CHECKS[kind] = fn
    return fn
  return wrap


def check_kinds() -> list[str]:
  return sorted(_CHECKS)


@register_check("answer_contains")
def _answer_contains(outcome, text: str) -> bool:
  """The final answer states `text` (case-insensitive, as a whole word or number)."""
  answer = episode_lib.final_answer(outcome.messages)
  return re.search(rf"(?<![\w.-]){re.escape(text)}(?![\w])", answer, re.I) is not None


@register_check("max_words")
def _max_words(outcome, n: int) -> bool:
  """The final answer is non-empty and has at most n words."""
  words = episode_lib.final_answer(outcome.messages).split()
  return 0 < len(words) <= n


@register_check("no_tool")
def _no_tool(outcome, tool: str) -> bool:
  """The agent never called `tool`."""
  return tool not in episode_lib.tool_call_names(outcome.messages)


@register_check("answer_starts_with")
def _answer_starts_with(outcome, prefix: str) -> bool:
  return episode_lib.final_answer(outcome.messages).lstrip().startswith(prefix)


def validate_checks(task_id: str, checks: list[dict]) -> None:
  for check in checks:
    if check.get("kind") not in _CHECKS or "id" not in check:
      raise ValueError(f"Task {task_id}: check {check} needs an 'id' and a 'kind' among "
                       f"{check_kinds()}.")


def apply_checks(task, outcome) -> dict[str, bool]:
  """check::<id> -> passed, for the task's transcript checks."""
  out = {}
  for check in task.metadata.get("checks", []):
    arguments = {k: v for k, v in check.items() if k not in ("id", "kind")}
    out[CHECK_PREFIX + check["id"]] = bool(_CHECKS[check["kind"]](outcome, **arguments))
  return out


_IGNORED_DIRS = ("__pycache__", ".pytest_cache", ".c2jax_eval")


def file_hashes(root: str) -> dict[str, str]:
  """sha256 of every regular file under root (caches ignored), by relative path."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _IGNORED_DIRS)
    for name in sorted(filenames):
      if name.endswith(".pyc"):
        continue
      full = os.path.join(dirpath, name)
      if os.path.islink(full) or not os.path.isfile(full):
        continue
      with open(full, "rb") as f:
        out[os.path.relpath(full, root)] = hashlib.sha256(f.read()).hexdigest()
  return out


_SCRIPT = '''"""Compares the workspace with the manifest taken when the task was built."""
import hashlib, json, os, sys
MANIFEST = json.loads({manifest!r})
ALLOWED = set(json.loads({allowed!r}))
HIDDEN = set(json.loads({hidden!r}))
IGNORED = {ignored!r}
seen = {{}}
for dirpath, dirnames, filenames in os.walk("."):
    dirnames[:] = [d for d in dirnames if d not in IGNORED]
    for name in filenames:
        path = os.path.relpath(os.path.join(dirpath, name), ".")
        if name.endswith(".pyc") or path in HIDDEN or os.path.islink(path):
            continue
        with open(path, "rb") as f:
            seen[path] = hashlib.sha256(f.read()).hexdigest()
changed = sorted(p for p in set(seen) | set(MANIFEST)
                 if seen.get(p) != MANIFEST.get(p) and p not in ALLOWED)
if changed:
    print("FAILED {test} - changed: " + ", ".join(changed[:20]))
    sys.exit(1)
print("PASSED {test}")
'''


def workspace_check_files(repo: str, allowed: tuple[str, ...] = (),
                          hidden: tuple[str, ...] = ()) -> dict[str, str]:
  """Hidden files {SCRIPT_PATH: script}; `hidden` lists the task's other hidden files
  (written into the grading fork, so not the agent's edits)."""
  script = _SCRIPT.format(manifest=json.dumps(file_hashes(repo)),
                          allowed=json.dumps(sorted(allowed)),
                          hidden=json.dumps(sorted(set(hidden) | {SCRIPT_PATH})),
                          ignored=_IGNORED_DIRS, test=WORKSPACE_TEST)
  return {SCRIPT_PATH: script}
