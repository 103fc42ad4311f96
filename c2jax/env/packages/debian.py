"""Debian's Go and Rust source packages: `deb:PACKAGE[=VERSION]` or a .deb file.

`golang-*-dev` packages hold Go module sources under /usr/share/gocode/src/<import
path>, `librust-*-dev` packages a crate under /usr/share/cargo/registry/<crate>-<version>,
each with its tests (Debian runs them when it builds the package). Their dependencies
are other packages of the same kinds, so a package and what it needs all come from the
Debian archive (`apt-get download`, no root needed beyond apt's own lists), and the
tests build offline: debian_go.py writes them as vendor/ with a vendor/modules.txt,
debian_rust.py as vendor/ with a cargo source replacement.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile

from c2jax.env.packages import apt, debian_go, debian_rust
from c2jax.env.packages.base import FetchError, Package, run

_NAME = re.compile(r'[a-z0-9][a-z0-9+.-]+')


def resolve(rest: str, timeout_s: float) -> tuple[str, str]:
  """(exact spec, PACKAGE=VERSION): without a version, the candidate apt would install."""
  name, _, version = rest.partition('=')
  if not _NAME.fullmatch(name):
    raise ValueError(f'deb:{rest}: {name!r} is not a Debian package name.')
  if not version:
    out = run(['apt-cache', 'policy', name], tempfile.gettempdir(), timeout_s,
              f'find {name} in the apt lists')
    found = re.search(r'Candidate:\s*(\S+)', out)
    if found is None or found.group(1) == '(none)':
      raise FetchError(f'deb:{name}: apt knows no installable version of it '
                       '(run `apt-get update`, or check the name with '
                       '`apt-cache search`).')
    version = found.group(1)
  return f'deb:{name}={version}', f'{name}={version}'


def identify_file(path: str, timeout_s: float) -> tuple[str, str]:
  path = os.path.abspath(path)
  fields = run(['dpkg-deb', '-f', path, 'Package', 'Version'],
               os.path.dirname(path), timeout_s,
               f'read the control fields of {path}')
  meta = dict(line.split(': ', 1) for line in fields.splitlines() if ': ' in line)
  if 'Package' not in meta or 'Version' not in meta:
    raise FetchError(f'{path} is not a Debian package (no Package / Version).')
  return f'deb:{meta["Package"]}={meta["Version"]}', os.path.abspath(path)


def materialise(exact: str, resolved: str, folder: str, timeout_s: float) -> Package:
  debs = os.path.join(folder, 'debs')
  if os.path.isfile(resolved):
    os.makedirs(debs)
    deb = shutil.copy(resolved, debs)
    steps = [f'took {os.path.basename(resolved)}']
  else:
    deb, = apt.download([resolved], debs, timeout_s)
    steps = [f'apt-get download {resolved}']
  root = apt.unpack(deb, os.path.join(folder, 'unpacked'), timeout_s)
  name = exact[len('deb:'):].split('=')[0]
  if os.path.isdir(os.path.join(root, apt.GOCODE)):
    builder = debian_go
  elif glob.glob(os.path.join(root, apt.CARGO_REGISTRY, '*', 'Cargo.toml')):
    builder = debian_rust
  else:
    raise FetchError(
        f'{exact} holds neither Go sources ({apt.GOCODE}) nor a Rust crate '
        f'({apt.CARGO_REGISTRY}); only golang-*-dev and librust-*-dev packages are task '
        'sources.')
  repo = os.path.join(folder, 'repo')
  label, dependency_steps = builder.make_repository(name, root, repo, debs, timeout_s,
                                                    exact)
  commit = run(['git', 'rev-parse', 'HEAD'], repo, timeout_s, 'read the commit')
  shutil.rmtree(os.path.join(folder, 'unpacked'), ignore_errors=True)
  return Package(spec=exact, name=label, path=repo, base_commit=commit.strip(),
                 steps=tuple(steps + dependency_steps))
