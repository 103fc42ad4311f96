"""Go modules: go.mod at the root, tests in *_test.go, `go test -json ./...`.

Dependencies (a go.mod with `require`) are vendored at build time (`go mod vendor`), so
the tree carries them and the test run needs no network (GOPROXY=off makes a missing
one fail at once instead of hanging on a proxy). The builder keeps go's build cache in
the workspace between its runs (BUILD_CACHE_ENV). A test id is the package's import path
and the test (`example.com/calc/TestAdd/sub`); its file is the *_test.go of that
package's folder that declares `func TestAdd(`.
"""

from __future__ import annotations

import functools
import os
import re

from c2jax.env import sandbox_base
from c2jax.env import toolchains
from c2jax.env.languages import base, mutate, revert

_MODULE = re.compile(r'^module\s+(\S+)', re.M)
_REQUIRE = re.compile(r'^require\b', re.M)
IGNORED_DIRS = frozenset({'vendor', 'testdata'})
# A cold build of a package and its dependencies every run otherwise (~1.5 s for a tiny
# package here, minutes for a big one).
BUILD_CACHE_ENV = f'GOCACHE={sandbox_base.WORKDIR}/.c2jax-cache/go-build'
REVERT = revert.RevertSpec(
    header=r'^func\s+(?:\([^)]*\)\s*)?(?P<name>\w+)', stub='panic("not implemented")',
    describes='panics with "not implemented"', never=frozenset({'main', 'init'}))
SYNTAX = mutate.Syntax(quotes=('"', "'"), raw_quotes=('`',))


def _go_mod(repo: str) -> str:
  return base.read(repo, 'go.mod')


def detect(repo: str) -> bool:
  return os.path.isfile(os.path.join(repo, 'go.mod'))


def prepare(repo: str, timeout_s: float) -> list[str]:
  if not _REQUIRE.search(_go_mod(repo)) or os.path.isdir(os.path.join(repo, 'vendor')):
    return []
  base.run_prepare(['go', 'mod', 'vendor'], repo, timeout_s)
  return ['go mod vendor']


def test_command(repo: str) -> tuple[str, str]:
  # -mod=vendor: go uses vendor/ by itself only when go.mod's go is >= 1.14 (Debian's
  # GOPATH-era packages say less). -count=1: a result replayed from go's test cache
  # would hide a flaky test.
  vendored = os.path.isfile(os.path.join(repo, 'vendor', 'modules.txt'))
  return ('GOPROXY=off ' + ('GOFLAGS=-mod=vendor ' if vendored else '')
          + 'go test -json -count=1 ./...'), 'go'


def is_test_file(rel: str) -> bool:
  return rel.endswith('_test.go')


def is_source_file(rel: str) -> bool:
  return rel.endswith('.go') and not is_test_file(rel)


def test_files_for(repo: str, test_ids: list[str]) -> list[str]:
  module = _MODULE.search(_go_mod(repo))
  if module is None:
    raise ValueError(f'{repo}/go.mod has no `module` line; it is not a Go module.')
  files = set()
  for rel in base.walk_files(repo, IGNORED_DIRS):
    if not is_test_file(rel):
      continue
    folder = os.path.dirname(rel)
    package = module.group(1) + ('/' + folder if folder else '')
    text = base.read(repo, rel)
    for test_id in test_ids:
      if not test_id.startswith(package + '/'):
        continue
      name = test_id[len(package) + 1:].split('/')[0]  # a subtest's parent
      if re.search(rf'^func {re.escape(name)}\(', text, re.M):
        files.add(rel)
  return sorted(files)


LANGUAGE = base.Language(
    name='go', detect=detect, prepare=prepare, test_command=test_command,
    is_test_file=is_test_file, is_source_file=is_source_file,
    test_files_for=test_files_for,
    toolchain_binds=functools.partial(toolchains.binds, 'go'), syntax=SYNTAX,
    ignored_dirs=IGNORED_DIRS, build_cache_env=BUILD_CACHE_ENV, revert=REVERT)
