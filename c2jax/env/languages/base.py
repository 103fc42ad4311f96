"""What the task builder needs to know about one language (Language), and the helpers
its entries share.

An entry answers, for a repository checkout: is it one of mine (detect); what must be
fetched once, with network, so that its tests then run offline (prepare); which command
runs its tests and which testlogs parser reads the output (test_command); which files
are tests (is_test_file) and which are sources where a planted bug may go
(is_source_file); which test files hold a given set of test ids (test_files_for: they
are hidden from the task's repository and come back as its test_patch); which host
folders its toolchain needs inside a sandbox (toolchain_binds); and how to mask its
comments and strings for the textual mutator (syntax) and find its functions for
revert tasks (revert), with the lines of a source file
that are tests all the same (inline_test_lines: Rust's `#[cfg(test)]` modules); which
folders hold no code of its own (ignored_dirs: fetched dependencies, build output).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from typing import Callable

from c2jax.env.languages import mutate, revert


@dataclasses.dataclass(frozen=True)
class Language:
  name: str
  detect: Callable[[str], bool]
  # (repo, timeout_s) -> the commands it ran; None: the repository is prepared by
  # `c2jax tasks install` instead (Python: a verified venv layer; task_builder.py).
  prepare: Callable[[str, float], list[str]] | None
  test_command: Callable[[str], tuple[str, str]]  # repo -> (command, testlogs parser)
  is_test_file: Callable[[str], bool]             # repository-relative path
  is_source_file: Callable[[str], bool]
  test_files_for: Callable[[str, list[str]], list[str]]  # (repo, test ids) -> files
  toolchain_binds: Callable[[], tuple[str, ...]]
  syntax: mutate.Syntax | None                    # None: the AST mutators (Python)
  # Folders never walked for sources or tests: fetched dependencies, build output.
  ignored_dirs: frozenset[str] = frozenset()
  # Variables the builder puts before the test command in its own runs only, so that a
  # build cache lives in the workspace and carries over to the next run and to forks
  # (the sandbox's /tmp is new for every command). Task repositories are copied from the
  # host's tree, so they never hold that cache, and tasks record the plain command.
  build_cache_env: str = ''
  # How to revert a function (revert.py); None: this language has no revert tasks.
  revert: revert.RevertSpec | None = None
  inline_test_lines: Callable[[str], frozenset[int]] = lambda text: frozenset()


def walk_files(repo: str, ignored_dirs: frozenset[str]) -> list[str]:
  """Repository-relative paths of every file outside .git and folders named in
  `ignored_dirs`, sorted."""
  found = []
  for dirpath, dirnames, filenames in os.walk(repo):
    dirnames[:] = sorted(d for d in dirnames if d != '.git' and d not in ignored_dirs)
    rel_dir = os.path.relpath(dirpath, repo)
    for name in filenames:
      found.append(os.path.normpath(os.path.join(rel_dir, name)))
  return sorted(found)


def read(repo: str, rel: str) -> str:
  with open(os.path.join(repo, rel), encoding='utf-8', errors='replace') as f:
    return f.read()


def run_prepare(command: list[str], repo: str, timeout_s: float) -> str:
  """Runs a fetch command on the host, with network, in `repo`, and returns its stdout;
  raises with its output when it fails (the tests cannot run offline without what it
  fetches)."""
  try:
    proc = subprocess.run(command, cwd=repo, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
  except FileNotFoundError as e:
    raise RuntimeError(f'{command[0]} is not installed; it is needed to fetch the '
                       f'dependencies of {repo}.') from e
  except subprocess.TimeoutExpired as e:
    raise RuntimeError(f'`{" ".join(command)}` in {repo} took over {timeout_s:.0f} s; '
                       'raise --timeout_s or fetch the dependencies beforehand.') from e
  if proc.returncode != 0:
    raise RuntimeError(f'`{" ".join(command)}` failed in {repo} (exit {proc.returncode}); '
                       'the tests cannot run offline without its dependencies:\n'
                       f'{(proc.stdout + proc.stderr)[-2000:]}')
  return proc.stdout

