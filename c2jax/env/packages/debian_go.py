"""A Debian `golang-*-dev` package as a Go module repository, its requirements vendored
from the Debian packages it depends on.

The module is the shallowest folder under /usr/share/gocode/src with a go.mod; a package
from before Go modules has none, and gets `module <its import path>` (`go 1.16`), the
path Debian files it under. Each module the go.mod requires is looked up in the Debian
dependency closure (by the `module` line of its go.mod, or by its import path) and
copied to vendor/<module path>, its test files and testdata/ left out as `go mod
vendor` leaves them; vendor/modules.txt lists it at the version go.mod asks for (the
go command checks the two agree; Debian's copy may be a patch release apart, which is
what Debian itself builds and tests with). A required module Debian does not have is
listed with no packages: the build then fails only if something imports it, and the
package's steps say it is missing.
"""

from __future__ import annotations

import os
import re
import shutil

from c2jax.env.packages import apt
from c2jax.env.packages.base import FetchError, commit_all

_MODULE = re.compile(r'^module\s+"?([^\s"]+)"?', re.M)
_REQUIRE_LINE = re.compile(r'^\s*(?:require\s+)?([^\s()]+)\s+(v[^\s]+)', re.M)


def _module_root(src: str) -> tuple[str, str]:
  """(import path, folder) of the package's module under gocode/src."""
  with_mod, with_go = [], []
  for dirpath, dirnames, filenames in os.walk(src):
    dirnames[:] = sorted(d for d in dirnames if d not in ('vendor', 'testdata'))
    rel = os.path.relpath(dirpath, src)
    if 'go.mod' in filenames:
      with_mod.append(rel)
    if any(f.endswith('.go') for f in filenames):
      with_go.append(rel)
  found = with_mod or with_go
  if not found:
    raise FetchError(f'{src} holds no Go source file.')
  depth = min(p.count(os.sep) for p in found)
  shallowest = sorted(p for p in found if p.count(os.sep) == depth)
  if len(shallowest) > 1 and not with_mod:
    # A GOPATH-era package whose files start below its import path's folder.
    common = os.path.commonpath(shallowest)
    shallowest = [common] if common not in ('', '.') else shallowest
  if len(shallowest) > 1:
    raise FetchError(f'{src} holds several Go modules at the same depth '
                     f'({shallowest}); c2jax cannot tell which is the package.')
  return shallowest[0].replace(os.sep, '/'), os.path.join(src, shallowest[0])


def requirements(go_mod: str) -> list[tuple[str, str]]:
  """(module, version) of every `require` of a go.mod text."""
  found, in_block = [], False
  for line in go_mod.splitlines():
    stripped = line.split('//')[0].strip()
    if stripped.startswith('require ('):
      in_block = True
      continue
    if in_block and stripped == ')':
      in_block = False
      continue
    if in_block or stripped.startswith('require '):
      match = _REQUIRE_LINE.match(stripped)
      if match:
        found.append((match.group(1), match.group(2)))
  return found


def _go_version(module_dir: str) -> str:
  path = os.path.join(module_dir, 'go.mod')
  if not os.path.isfile(path):
    return ''
  with open(path, encoding='utf-8') as f:
    found = re.search(r'^go\s+(\d+\.\d+)', f.read(), re.M)
  return found.group(1) if found else ''


def _index(trees: list[str]) -> dict[str, str]:
  """module or import path -> its folder, over unpacked Debian packages."""
  index = {}
  for tree in trees:
    src = os.path.join(tree, apt.GOCODE)
    for dirpath, dirnames, filenames in os.walk(src):
      dirnames[:] = [d for d in dirnames if d not in ('vendor', 'testdata')]
      rel = os.path.relpath(dirpath, src).replace(os.sep, '/')
      index.setdefault(rel, dirpath)
      if 'go.mod' in filenames:
        with open(os.path.join(dirpath, 'go.mod'), encoding='utf-8') as f:
          module = _MODULE.search(f.read())
        if module:
          index[module.group(1)] = dirpath
  return index


def _copy_module(source: str, dest: str) -> list[str]:
  """Copies a module without tests, testdata or nested modules; returns its package
  folders (relative, '/'-separated; '' for the module's own)."""
  found = []
  for dirpath, dirnames, filenames in os.walk(source):
    rel = os.path.relpath(dirpath, source)
    nested = rel != '.' and 'go.mod' in filenames
    if nested:
      dirnames[:] = []
      continue
    dirnames[:] = sorted(d for d in dirnames if d not in ('vendor', 'testdata', '.git'))
    kept = [f for f in filenames if not f.endswith('_test.go')]
    os.makedirs(os.path.join(dest, rel), exist_ok=True)
    for name in kept:
      shutil.copy2(os.path.join(dirpath, name), os.path.join(dest, rel, name))
    if any(f.endswith('.go') for f in kept):
      found.append('' if rel == '.' else rel.replace(os.sep, '/'))
  return sorted(found)


def make_repository(name: str, root: str, repo: str, debs: str, timeout_s: float,
                    exact: str) -> tuple[str, list[str]]:
  import_path, folder = _module_root(os.path.join(root, apt.GOCODE))
  shutil.copytree(folder, repo, symlinks=False, ignore_dangling_symlinks=True)
  steps = []
  go_mod_path = os.path.join(repo, 'go.mod')
  if not os.path.isfile(go_mod_path):
    with open(go_mod_path, 'w', encoding='utf-8') as f:
      f.write(f'module {import_path}\n\ngo 1.16\n')
    steps.append(f'wrote go.mod (module {import_path}): the package predates Go modules')
  commit_all(repo, f'{exact}: {import_path} as packaged by Debian')
  with open(go_mod_path, encoding='utf-8') as f:
    required = requirements(f.read())
  label = re.sub(r'^golang-|-dev$', '', name) + '@' + exact.split('=', 1)[1]
  if not required:
    return label, steps
  closure = apt.dependency_closure(name, 'golang-', timeout_s)
  deps = os.path.join(os.path.dirname(repo), 'deps')
  trees = [apt.unpack(deb, os.path.join(deps, os.path.basename(deb)), timeout_s)
           for deb in (apt.download(closure, os.path.join(debs, 'deps'), timeout_s)
                       if closure else [])]
  index = _index(trees)
  lines, missing = [], []
  for module, version in required:
    if module not in index:
      lines += [f'# {module} {version}', '## explicit']
      missing.append(module)
      continue
    # Each vendored module compiles at its own go.mod's language version (Debian's copy
    # may need a newer one than the version go.mod asks for).
    language = _go_version(index[module])
    lines += [f'# {module} {version}',
              '## explicit' + (f'; go {language}' if language else '')]
    for package in _copy_module(index[module], os.path.join(repo, 'vendor', module)):
      lines.append(module + ('/' + package if package else ''))
  with open(os.path.join(repo, 'vendor', 'modules.txt'), 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')
  shutil.rmtree(deps, ignore_errors=True)
  steps.append(f'vendored {len(required) - len(missing)} required module(s) from Debian '
               f'({", ".join(closure)})')
  if missing:
    steps.append(f'not in Debian\'s dependencies of {name}: {", ".join(missing)} '
                 '(listed in vendor/modules.txt without packages)')
  commit_all(repo, f'vendor/ from Debian: {", ".join(closure) or "none"}'
             + (f'; missing {", ".join(missing)}' if missing else ''))
  return label, steps
