"""The registry of languages by name, and which one a checkout is written in."""

from __future__ import annotations

import os

from c2jax.env.languages import go, node, python, rust
from c2jax.env.languages.base import Language

LANGUAGES: dict[str, Language] = {
    entry.name: entry
    for entry in (python.LANGUAGE, go.LANGUAGE, rust.LANGUAGE, node.LANGUAGE)}


def get(name: str) -> Language:
  if name not in LANGUAGES:
    raise ValueError(f'Unknown language {name!r}; choose one of {sorted(LANGUAGES)}.')
  return LANGUAGES[name]


def detect(repo: str) -> Language:
  """The language whose marker file is at the root of `repo`. Python is the fallback, as
  `c2jax tasks` built only Python before and its installer finds its way in checkouts
  with none of Python's markers too (requirements files, tox.ini): a source
  distribution (a file), a checkout with no other language's marker, and one with
  Python's markers and others' are Python. Other ties raise."""
  if os.path.isfile(repo):
    return LANGUAGES['python']
  if not os.path.isdir(repo):
    raise FileNotFoundError(f'{repo} is neither a folder nor a source distribution.')
  found = [entry for entry in LANGUAGES.values() if entry.detect(repo)]
  if not found or LANGUAGES['python'] in found:
    return LANGUAGES['python']
  if len(found) > 1:
    names = [entry.name for entry in found]
    raise ValueError(f'{repo} looks like several languages ({names}); pick one with '
                     '--language.')
  return found[0]

