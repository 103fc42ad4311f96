"""A Debian `librust-*-dev` package as a crate repository, the crates it needs vendored
from Debian's `librust-*-dev` packages.

The crate is the package's folder under /usr/share/cargo/registry. Its dependencies go
to vendor/, which .cargo/config.toml puts in place of crates.io (a directory source:
Debian ships each crate with the `.cargo-checksum.json` such a source reads), and cargo
itself says what is still missing: `cargo generate-lockfile --offline` runs until it
resolves, each `no matching package named X` / `failed to select a version for X`
fetching the Debian package of X (`librust-x-dev`, or a versioned one such as
`librust-x-0.8-dev` when the requirement wants another major version). Cargo resolves
every optional and dev-dependency of the crate itself (not those of its dependencies):
one that Debian does not ship (a benchmark harness, a crate of the standard library's
own build) is dropped from the crate's Cargo.toml, with the features naming it and
the test, example and bench files that use it (they could not compile), and the
package's steps and the commit say which. A required dependency Debian lacks is an
error. The resulting Cargo.lock is committed: the tests build against exactly those
versions.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tomllib

from c2jax.env.packages import apt
from c2jax.env.packages.base import FetchError, commit_all, run

_SECTIONS = ('dependencies', 'dev-dependencies', 'build-dependencies')
_NO_MATCH = re.compile(r'no matching package (?:named|found)[^`]*`([^`]+)`')
_NO_VERSION = re.compile(r'failed to select a version for the requirement `([^ `]+) = "([^"]+)"`')
_REQUIRED_BY = re.compile(r'required by package `([^ `]+) v')
_CONFIG = ('[source.crates-io]\nreplace-with = "debian-vendor"\n\n'
           '[source.debian-vendor]\ndirectory = "vendor"\n')
MAX_ROUNDS = 200


def _dependency_tables(manifest: dict):
  """(section path, table) of every dependency table, target-specific ones too."""
  for section in _SECTIONS:
    if section in manifest:
      yield (section,), manifest[section]
  for target, tables in manifest.get('target', {}).items():
    for section in _SECTIONS:
      if section in tables:
        yield ('target', target, section), tables[section]


def _droppable(manifest: dict, crate: str) -> list[tuple[tuple[str, ...], str]]:
  """(section path, key) of the crate's entries for package `crate` that may go: dev-,
  optional and target-specific dependencies (a plain dependency may not)."""
  found = []
  for path, table in _dependency_tables(manifest):
    for key, spec in table.items():
      package = spec.get('package', key) if isinstance(spec, dict) else key
      if package.replace('_', '-') != crate.replace('_', '-'):
        continue
      optional = isinstance(spec, dict) and spec.get('optional', False)
      if path[-1] == 'dev-dependencies' or optional or path[0] == 'target':
        found.append((path, key))
      else:
        return []
  return found


def _name(text: str) -> str:
  """A table name compared without whitespace and quotes."""
  return re.sub(r'[\s\'"]', '', text)


def _features_text(features: dict, dropped: set[str]) -> str:
  """The [features] table again, without the items that name a dropped dependency
  (`dep`, `dep:dep`, `dep/feature`, `dep?/feature`)."""
  lines = ['[features]']
  for name, items in features.items():
    kept = [i for i in items if re.sub(r'^dep:|\??/.*$', '', i) not in dropped]
    key = name if re.fullmatch(r'[\w-]+', name) else json.dumps(name)
    lines.append(f'{key} = [{", ".join(json.dumps(i) for i in kept)}]')
  return '\n'.join(lines) + '\n\n'


def drop_dependency(text: str, manifest: dict, crate: str) -> str | None:
  """Cargo.toml `text` without its droppable entries for `crate` and the feature items
  that name them; None when one of them is a plain dependency or none is there. Tables
  (`[dev-dependencies.rand]`, crates.io's normalised form) and inline entries (`rand =
  "0.7"` under `[dev-dependencies]`) both go; [features] is written again."""
  entries = _droppable(manifest, crate)
  if not entries:
    return None
  keys = {key for _, key in entries}
  tables = {_name('.'.join(path + (key,))) for path, key in entries}
  sections = {_name('.'.join(path)) for path, _ in entries}
  out, section = [], ''
  for line in text.splitlines(keepends=True):
    header = re.match(r'^\s*\[([^\[\]]+)\]\s*(#.*)?$', line)
    if header or re.match(r'^\s*\[\[', line):
      section = _name(header.group(1)) if header else ''
      if section == 'features':
        out.append(_features_text(manifest.get('features', {}), keys))
    if section in tables or section == 'features':
      continue
    key = re.match(r'^\s*"?([\w-]+)"?\s*=', line)
    if key and key.group(1) in keys and section in sections:
      continue
    out.append(line)
  new = ''.join(out)
  if _droppable(tomllib.loads(new), crate):
    raise FetchError(f'Could not remove {crate} from Cargo.toml (a form c2jax does not '
                     'edit); remove it by hand.')
  return new


def prune_targets(repo: str, dropped: list[str]) -> list[str]:
  """Deletes the test, example and bench files that use a dropped crate (they could not
  compile; Debian patches such targets out too) and their [[test]] / [[example]] /
  [[bench]] tables; returns the files deleted."""
  idents = '|'.join(re.escape(c.replace('-', '_')) for c in dropped)
  uses = re.compile(rf'(?:\bextern\s+crate\s+|\buse\s+|\b)(?:{idents})\b(?:\s*;|::)')
  deleted = []
  for folder in ('tests', 'examples', 'benches'):
    for path in sorted(glob.glob(os.path.join(repo, folder, '**', '*.rs'), recursive=True)):
      with open(path, encoding='utf-8', errors='replace') as f:
        if uses.search(f.read()):
          os.remove(path)
          deleted.append(os.path.relpath(path, repo))
  if not deleted:
    return deleted
  manifest_path = os.path.join(repo, 'Cargo.toml')
  with open(manifest_path, encoding='utf-8') as f:
    blocks = re.split(r'(?m)^(?=\[)', f.read())
  kept = []
  for block in blocks:
    target = re.match(r'\[\[(test|example|bench)\]\]', block)
    if target:
      name = re.search(r'^name\s*=\s*"([^"]+)"', block, re.M)
      path = re.search(r'^path\s*=\s*"([^"]+)"', block, re.M)
      folder = {'test': 'tests', 'example': 'examples', 'bench': 'benches'}[target.group(1)]
      rel = os.path.normpath(path.group(1) if path else
                             os.path.join(folder, (name.group(1) if name else '') + '.rs'))
      if rel in deleted:
        continue
    kept.append(block)
  with open(manifest_path, 'w', encoding='utf-8') as f:
    f.write(''.join(kept))
  return deleted


def _candidates(crate: str, requirement: str) -> list[str]:
  """Debian package names that may hold `crate` at `requirement`, the best first."""
  name = crate.replace('_', '-').lower()
  numbers = re.findall(r'\d+', requirement)
  versioned = []
  if numbers:
    major = numbers[0]
    versioned.append(f'librust-{name}-{major}-dev' if major != '0' or len(numbers) < 2
                     else f'librust-{name}-0.{numbers[1]}-dev')
  return versioned + [f'librust-{name}-dev']


def _add_crates(debs: list[str], vendor: str, scratch: str, timeout_s: float) -> list[str]:
  added = []
  for deb in debs:
    tree = apt.unpack(deb, os.path.join(scratch, os.path.basename(deb)), timeout_s)
    for crate_dir in glob.glob(os.path.join(tree, apt.CARGO_REGISTRY, '*')):
      dest = os.path.join(vendor, os.path.basename(crate_dir))
      if not os.path.exists(dest):
        shutil.copytree(crate_dir, dest, symlinks=False, ignore_dangling_symlinks=True)
        added.append(os.path.basename(crate_dir))
  return added


def make_repository(name: str, root: str, repo: str, debs: str, timeout_s: float,
                    exact: str) -> tuple[str, list[str]]:
  crate_dir, = glob.glob(os.path.join(root, apt.CARGO_REGISTRY, '*'))
  shutil.copytree(crate_dir, repo, symlinks=False, ignore_dangling_symlinks=True)
  crate = os.path.basename(crate_dir)
  commit_all(repo, f'{exact}: {crate} as packaged by Debian')
  label = crate.rsplit('-', 1)[0] + '@' + exact.split('=', 1)[1]
  manifest_path = os.path.join(repo, 'Cargo.toml')
  with open(manifest_path, 'rb') as f:
    manifest = tomllib.load(f)
  if not any(table for _, table in _dependency_tables(manifest)):
    return label, []
  vendor, scratch = os.path.join(repo, 'vendor'), os.path.join(os.path.dirname(repo), 'deps')
  os.makedirs(vendor)
  os.makedirs(os.path.join(repo, '.cargo'), exist_ok=True)
  with open(os.path.join(repo, '.cargo', 'config.toml'), 'a', encoding='utf-8') as f:
    f.write(_CONFIG)
  closure = apt.dependency_closure(name, 'librust-', timeout_s)
  added = _add_crates(apt.download(closure, os.path.join(debs, 'deps'), timeout_s)
                      if closure else [], vendor, scratch, timeout_s)
  dropped, tried = [], set(closure) | {name}
  for _ in range(MAX_ROUNDS):
    try:
      run(['cargo', 'generate-lockfile', '--offline'], repo, timeout_s,
          'resolve the crate\'s dependencies from vendor/')
      break
    except FetchError as e:
      message = str(e)
    missing, version = _NO_MATCH.search(message), _NO_VERSION.search(message)
    if version:
      wanted, requirement = version.group(1), version.group(2)
    elif missing:
      wanted, requirement = missing.group(1), ''
    else:
      raise FetchError(f'{exact}: cargo cannot resolve the crate\'s '
                       f'dependencies from Debian\'s packages:\n{message}')
    fresh = [c for c in _candidates(wanted, requirement)
             if c not in tried and apt.available(c, timeout_s)]
    if fresh:
      tried.add(fresh[0])
      added += _add_crates(apt.download([fresh[0]], os.path.join(debs, 'deps'),
                                        timeout_s), vendor, scratch, timeout_s)
      continue
    by = _REQUIRED_BY.search(message)
    with open(manifest_path, encoding='utf-8') as f:
      text = f.read()
    new = (drop_dependency(text, tomllib.loads(text), wanted)
           if by is None or by.group(1) == manifest['package']['name'] else None)
    if new is None:
      raise FetchError(
          f'{exact}: cargo needs {wanted} {requirement or ""} (required by '
          f'{by.group(1) if by else "the crate"}), which no Debian package c2jax tried '
          f'({", ".join(_candidates(wanted, requirement))}) provides at that version.')
    with open(manifest_path, 'w', encoding='utf-8') as f:
      f.write(new)
    dropped.append(wanted)
  else:
    raise FetchError(f'{exact}: dependencies still unresolved after '
                     f'{MAX_ROUNDS} rounds.')
  shutil.rmtree(scratch, ignore_errors=True)
  steps = [f'vendored {len(added)} crate(s) from Debian: {", ".join(sorted(added))}']
  if dropped:
    steps.append(f'dropped from Cargo.toml (not in Debian): {", ".join(dropped)}')
    pruned = prune_targets(repo, dropped)
    if pruned:
      steps.append(f'deleted the targets that use them: {", ".join(pruned)}')
      run(['cargo', 'generate-lockfile', '--offline'], repo, timeout_s,
          'resolve the crate\'s dependencies again without those targets')
  commit_all(repo, 'vendor/ and Cargo.lock from Debian' +
             (f'; dropped {", ".join(dropped)} (not in Debian)' if dropped else ''))
  return label, steps
