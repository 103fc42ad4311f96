"""npm packages: `npm:NAME[@VERSION|@RANGE]` (scoped names too: `npm:@scope/name@1.0.0`),
or a tarball `npm pack` wrote. The published tarball is the tree (its files under
`package/`); whether it ships its tests is up to its author (many do not: the builder
then says that no test ran). Dependencies are not fetched here: the node task builder
installs them (`npm install`, c2jax/env/languages/node.py).
"""

from __future__ import annotations

import json
import os
import re
import tarfile
import tempfile

from c2jax.env.packages.base import FetchError, Package, commit_all, run


def _split(rest: str) -> tuple[str, str]:
  """('@scope/name', '1.2') of '@scope/name@1.2': the version follows the last '@' that
  is not the scope's."""
  at = rest.rfind('@')
  return (rest[:at], rest[at + 1:]) if at > 0 else (rest, '')


def _version_key(version: str):
  core, _, pre = version.partition('-')
  numbers = [int(p) if p.isdigit() else 0 for p in core.split('.')]
  return numbers, pre == '', pre


def resolve(rest: str, timeout_s: float) -> tuple[str, str]:
  """(exact spec, NAME@VERSION) for `NAME[@VERSION|@RANGE]`: a range or a dist-tag is
  resolved to the highest version the registry has for it."""
  name, wanted = _split(rest)
  if not re.fullmatch(r'(@[\w.-]+/)?[\w.-]+', name):
    raise ValueError(f'npm:{rest}: {name!r} is not an npm package name.')
  out = run(['npm', 'view', f'{name}@{wanted or "latest"}', 'version', '--json'],
            tempfile.gettempdir(), timeout_s, f'find {name} on the npm registry')
  found = json.loads(out) if out.strip() else None
  if isinstance(found, list):
    found = max(found, key=_version_key) if found else None
  if not found:
    raise FetchError(f'npm:{rest}: the npm registry has no version of {name} '
                     f'matching {wanted or "latest"!r}.')
  return f'npm:{name}@{found}', f'{name}@{found}'


def _unpack(tarball: str, dest: str) -> None:
  with tarfile.open(tarball) as tar:
    members = tar.getmembers()
    # npm's tarballs hold one top folder, 'package/' for nearly all packages.
    roots = {m.name.split('/')[0] for m in members}
    if len(roots) != 1:
      raise FetchError(f'{tarball} is not an npm package tarball (it has '
                       f'{len(roots)} top-level entries, npm pack makes one).')
    root = roots.pop() + '/'
    kept = []
    for member in members:
      if member.name.startswith(root) and (member.isfile() or member.isdir()):
        member.name = member.name[len(root):]
        kept.append(member)
    tar.extractall(dest, members=kept, filter='data')
  if not os.path.isfile(os.path.join(dest, 'package.json')):
    raise FetchError(f'{tarball} has no package.json; it is not an npm package.')


def identify_file(path: str, timeout_s: float) -> tuple[str, str]:
  del timeout_s
  with tarfile.open(path) as tar:
    manifest = next((m for m in tar.getmembers()
                     if m.name.count('/') == 1 and m.name.endswith('/package.json')), None)
    if manifest is None:
      raise FetchError(f'{path} holds no package.json at its top folder; it is '
                       'not an `npm pack` tarball.')
    meta = json.load(tar.extractfile(manifest))
  return f'npm:{meta["name"]}@{meta["version"]}', os.path.abspath(path)


def materialise(exact: str, resolved: str, folder: str, timeout_s: float) -> Package:
  """Packs (or takes) the tarball and commits its tree as folder/repo."""
  name_version = exact[len('npm:'):]
  steps = []
  if os.path.isfile(resolved):
    tarball = resolved
    steps.append(f'unpacked {os.path.basename(resolved)}')
  else:
    out = run(['npm', 'pack', resolved, '--json', '--pack-destination', folder],
              folder, timeout_s, f'download {resolved} from the npm registry')
    tarball = os.path.join(folder, json.loads(out)[0]['filename'])
    steps.append(f'npm pack {resolved}')
  repo = os.path.join(folder, 'repo')
  os.makedirs(repo)
  _unpack(tarball, repo)
  commit = commit_all(repo, f'{exact} as published')
  return Package(spec=exact, name=name_version.lstrip('@').replace('/', '-'),
                 path=repo, base_commit=commit, steps=tuple(steps))
