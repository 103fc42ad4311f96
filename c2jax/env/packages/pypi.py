"""PyPI source distributions: `pypi:NAME[==VERSION]`, downloaded with this interpreter's
pip (its configured index) as an sdist, never a wheel: the Python task builder
(`c2jax tasks install` / `build`) takes the sdist file as it is.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

from c2jax.env.packages.base import FetchError, Package, run

_NAME = re.compile(r'[A-Za-z0-9][A-Za-z0-9._-]*')


def resolve(rest: str, timeout_s: float) -> tuple[str, str]:
  name, _, version = rest.partition('==')
  if not _NAME.fullmatch(name) or (version and not re.fullmatch(r'[\w.+!-]+', version)):
    raise ValueError(f'pypi:{rest} is not NAME or NAME==VERSION.')
  if not version:
    out = run([sys.executable, '-m', 'pip', 'index', 'versions', name],
              tempfile.gettempdir(), timeout_s, f'find {name} on the package index')
    found = re.search(rf'^{re.escape(name)} \(([^)]+)\)', out, re.M | re.I)
    if found is None:
      raise FetchError(f'pypi:{name}: the package index lists no version of it.')
    version = found.group(1)
  return f'pypi:{name}=={version}', f'{name}=={version}'


def materialise(exact: str, resolved: str, folder: str, timeout_s: float) -> Package:
  run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--no-binary', ':all:',
       '--disable-pip-version-check', '-d', folder, resolved], folder, timeout_s,
      f'download the source distribution of {resolved}')
  sdists = [f for f in os.listdir(folder) if f.endswith(('.tar.gz', '.zip', '.tar.bz2'))]
  if len(sdists) != 1:
    raise FetchError(f'pip download {resolved} gave {sdists or "no file"}; '
                     'expected one source distribution.')
  return Package(spec=exact, name=resolved.replace('==', '@'),
                 path=os.path.join(folder, sdists[0]), base_commit='',
                 steps=(f'pip download --no-deps --no-binary :all: {resolved}',))
