"""Python packages: pyproject.toml, setup.py, setup.cfg, requirements.txt or tox.ini at
the root (and, by registry.detect's fallback, any checkout of no other language).

Their environment is not prepared here: `c2jax tasks install` makes and verifies a venv
layer, and task_builder.build_suite plants bugs with the AST mutators of
bug_injection.py (and reverts functions); this entry says how to recognise the
repositories and answers the same questions as the other languages, by the rules those
modules already use.
"""

from __future__ import annotations

import os

from c2jax.env import bubblewrap, revert_restore
from c2jax.env.languages import base

_MARKERS = ('pyproject.toml', 'setup.py', 'setup.cfg', 'requirements.txt', 'tox.ini')


def detect(repo: str) -> bool:
  return any(os.path.isfile(os.path.join(repo, m)) for m in _MARKERS)


def test_command(repo: str) -> tuple[str, str]:
  return revert_restore.test_command(repo), 'pytest'


def is_test_file(rel: str) -> bool:
  # pylint: disable-next=protected-access
  return rel.endswith('.py') and revert_restore._is_test_file(rel)


def is_source_file(rel: str) -> bool:
  return rel.endswith('.py') and not is_test_file(rel) and os.path.basename(rel) != 'setup.py'


def test_files_for(repo: str, test_ids: list[str]) -> list[str]:
  # pytest ids begin with the file: 'tests/test_calc.py::test_add[1]'.
  return sorted({t.split('::')[0] for t in test_ids
                 if os.path.isfile(os.path.join(repo, t.split('::')[0]))})


LANGUAGE = base.Language(
    name='python', detect=detect, prepare=None, test_command=test_command,
    is_test_file=is_test_file, is_source_file=is_source_file,
    test_files_for=test_files_for, toolchain_binds=bubblewrap.default_ro_binds,
    syntax=None, ignored_dirs=frozenset({'.venv', 'build', 'dist', '__pycache__'}))
