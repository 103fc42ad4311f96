"""Released packages as git repositories to build tasks from: npm packages, Debian's Go
and Rust source packages (`golang-*-dev`, `librust-*-dev`), PyPI source distributions.

  package = packages.fetch('npm:minimist@1.2.8')
  package.path, package.base_commit      # a git repository, its HEAD
  packages.fetch('deb:golang-github-google-go-cmp-dev')      # the candidate version
  packages.fetch('deb:librust-semver-dev=1.0.14-1')
  packages.fetch('pypi:six==1.16.0').path                    # an sdist (.tar.gz) file
  packages.fetch('path/to/minimist-1.2.8.tgz')               # an `npm pack` tarball
  packages.fetch('path/to/librust-itoa-dev_1.0.1-2_amd64.deb')

A spec names a registry and a package, with a version or without one (the registry's
current version, resolved once and written into `Package.spec`, so a build report
names exactly what it built from). What each registry gives:
- npm (npm.py): `npm pack` of the version; the tarball's `package/` is the tree.
- Debian (debian.py): `apt-get download` of the binary package and its Debian
  dependencies, unpacked with `dpkg-deb`. A Go package's module (its go.mod, or one
  written for a GOPATH-era package) is the tree, and the modules it requires come from
  the Debian packages it depends on as `vendor/`; a Rust crate's folder under
  /usr/share/cargo/registry is the tree, and the crates it needs come from Debian as
  `vendor/` with a cargo source replacement: the tests then build offline, since neither
  proxy.golang.org nor crates.io is needed.
- PyPI (`pip download --no-binary :all:`): the sdist itself, which `c2jax tasks
  install` / `build` already take.

The tree becomes a git repository: one commit of the package as released, and for
Debian packages with dependencies a second commit adding them (and any optional or test
dependency Debian does not ship, dropped from the manifest, as the commit message and
`Package.steps` say). Commits have a fixed author and date, so the same package gives
the same `base_commit` on every machine. Fetched packages are cached by exact spec under
`cache_dir` (~/.cache/c2jax/packages): a second fetch reads the cache, network-free.
Fetches run on the host, with network: fetch only from registries you trust.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile

from c2jax.env.packages import debian, npm, pypi
from c2jax.env.packages.base import (DEFAULT_CACHE, REGISTRIES, FetchError, Package,
                                     commit_all, run)

__all__ = ['DEFAULT_CACHE', 'REGISTRIES', 'FetchError', 'Package', 'commit_all', 'fetch',
           'is_spec', 'run']


def is_spec(text: str) -> bool:
  """Whether `text` names a package (a registry spec, or an npm tarball / Debian package
  file) rather than a checkout folder or an sdist."""
  registry = text.split(':', 1)[0]
  return (registry in REGISTRIES and ':' in text) or (
      os.path.isfile(text) and text.endswith(('.tgz', '.deb')))


def _cache_key(spec: str) -> str:
  return re.sub(r'[^A-Za-z0-9_.+=@-]', '_', spec.replace('/', '__'))


def _load_cached(folder: str) -> Package | None:
  meta = os.path.join(folder, 'package.json.c2jax')
  if not os.path.isfile(meta):
    return None
  with open(meta) as f:
    record = json.load(f)
  record['steps'] = tuple(record.get('steps', ()))
  package = Package(**record)
  return package if os.path.exists(package.path) else None


def fetch(spec: str, cache_dir: str = DEFAULT_CACHE, timeout_s: float = 600.0) -> Package:
  """The package `spec` names, as a git repository (npm, deb) or an sdist (pypi), from
  the cache when it was fetched before."""
  if os.path.isfile(spec) and spec.endswith(('.tgz', '.deb')):
    source = npm if spec.endswith('.tgz') else debian
    exact, resolved = source.identify_file(spec, timeout_s)
  else:
    registry, _, rest = spec.partition(':')
    if registry not in REGISTRIES or not rest:
      raise ValueError(f'{spec!r} is not a package spec: expected npm:NAME[@VERSION], '
                       'deb:PACKAGE[=VERSION] or pypi:NAME[==VERSION], or an .tgz (npm '
                       'pack) / .deb file.')
    source = {'npm': npm, 'deb': debian, 'pypi': pypi}[registry]
    # An exact version fetched before needs no registry (a suite's instances are made
    # offline from the cache).
    cached = _load_cached(os.path.join(os.path.expanduser(cache_dir), _cache_key(spec)))
    if cached is not None:
      return cached
    exact, resolved = source.resolve(rest, timeout_s)
  folder = os.path.join(os.path.expanduser(cache_dir), _cache_key(exact))
  cached = _load_cached(folder)
  if cached is not None:
    return cached
  shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(os.path.dirname(folder), exist_ok=True)
  staging = tempfile.mkdtemp(prefix='.fetch-', dir=os.path.dirname(folder))
  try:
    package = source.materialise(exact, resolved, staging, timeout_s)
    # Paths were made under staging; the finished folder, its record included, takes
    # its place whole (a fetch killed half way leaves only a .fetch- folder).
    package = dataclasses.replace(package, path=package.path.replace(staging, folder, 1))
    with open(os.path.join(staging, 'package.json.c2jax'), 'w') as f:
      json.dump(package.to_json(), f, indent=1)
    os.rename(staging, folder)
  except OSError:
    shutil.rmtree(staging, ignore_errors=True)
    cached = _load_cached(folder)  # another process fetched it meanwhile
    if cached is None:
      raise
    return cached
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return package
