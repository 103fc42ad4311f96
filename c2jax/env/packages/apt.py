"""The Debian archive through apt, as the package sources use it: download packages
(`apt-get download`: no root needed beyond apt's own lists), unpack them (`dpkg-deb -x`),
list a package's dependency closure, and where Go and Rust sources live inside."""

from __future__ import annotations

import os
import re
import tempfile

from c2jax.env.packages.base import FetchError, run

GOCODE = os.path.join('usr', 'share', 'gocode', 'src')
CARGO_REGISTRY = os.path.join('usr', 'share', 'cargo', 'registry')


def download(names: list[str], into: str, timeout_s: float) -> list[str]:
  """The .deb files of `names` (NAME or NAME=VERSION) downloaded into `into`."""
  os.makedirs(into, exist_ok=True)
  before = set(os.listdir(into))
  run(['apt-get', 'download', '-q', *names], into, timeout_s,
      f'download {", ".join(names)} from the Debian archive')
  return sorted(os.path.join(into, f) for f in set(os.listdir(into)) - before
                if f.endswith('.deb'))


def unpack(deb: str, into: str, timeout_s: float) -> str:
  os.makedirs(into, exist_ok=True)
  run(['dpkg-deb', '-x', deb, into], into, timeout_s, f'unpack {deb}')
  return into


def available(name: str, timeout_s: float) -> bool:
  """Whether apt can download the package `name` (a real one, not only provided)."""
  try:
    out = run(['apt-cache', 'policy', name], tempfile.gettempdir(), timeout_s,
              f'look {name} up')
  except FetchError:
    return False
  found = re.search(r'Candidate:\s*(\S+)', out)
  return found is not None and found.group(1) != '(none)'


def dependency_closure(name: str, prefix: str, timeout_s: float) -> list[str]:
  """The packages `name` depends on, recursively, whose names start with `prefix`
  (virtual packages resolved to their providers by apt), without `name` itself."""
  out = run(['apt-cache', 'depends', '--recurse', '--no-recommends',
             '--no-suggests', '--no-conflicts', '--no-breaks', '--no-replaces',
             '--no-enhances', name], tempfile.gettempdir(), timeout_s,
            f'list the dependencies of {name}')
  found = {line.strip() for line in out.splitlines()
           if line and not line[0].isspace() and line.startswith(prefix)}
  return sorted(found - {name})
