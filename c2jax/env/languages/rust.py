"""Rust crates: Cargo.toml at the root, `cargo test --offline --no-fail-fast`.

Dependencies are vendored at build time (`cargo vendor`, with the source replacement it
prints written to .cargo/config.toml), so the tree carries them and `--offline` finds
them. Test files: integration tests under tests/ (test ids `<file stem>::<test>`, the
files a task hides and returns as its test_patch). Unit tests live inside the source
files, in `#[cfg(test)]` modules (ids `<crate>::tests::<test>`): the mutator leaves
those lines alone, and they stay in the task's repository, visible to the agent, since
hiding them would hide the code under test too.

Inside the sandbox the toolchain is the active rustup toolchain's folder (`rustc --print
sysroot`), bound read-only: its bin/ holds cargo and rustc themselves, not rustup's
proxies, which would look for ~/.rustup.
"""

from __future__ import annotations

import functools
import os
import re
import tomllib

from c2jax.env import toolchains
from c2jax.env.languages import base, mutate, revert

IGNORED_DIRS = frozenset({'target', 'vendor'})
SYNTAX = mutate.Syntax(quotes=('"',), char_literal=r"'(?:\\[^']{1,10}|[^'\\\n])'",
                       skip_line=r'(use|mod|extern|pub\s+use|pub\s+mod)\b|#!?\[')
REVERT = revert.RevertSpec(
    header=(r'^[ \t]*(?:pub(?:\([^)]*\))?\s+)?(?:(?:const|async|unsafe|extern)\s+)*'
            r'fn\s+(?P<name>\w+)'),
    stub='todo!()', describes='calls todo!()', never=frozenset({'main'}))
_CFG_TEST = re.compile(r'^[ \t]*#\[cfg\(test\)\]', re.M)


def _manifest(repo: str) -> dict:
  with open(os.path.join(repo, 'Cargo.toml'), 'rb') as f:
    return tomllib.load(f)


def detect(repo: str) -> bool:
  return os.path.isfile(os.path.join(repo, 'Cargo.toml'))


def _has_dependencies(manifest: dict) -> bool:
  sections = ('dependencies', 'dev-dependencies', 'build-dependencies')
  if any(manifest.get(s) for s in sections):
    return True
  return any(table.get(s) for table in manifest.get('target', {}).values()
             for s in sections) or bool(manifest.get('workspace', {}).get('members'))


def prepare(repo: str, timeout_s: float) -> list[str]:
  if not _has_dependencies(_manifest(repo)) or os.path.isdir(os.path.join(repo, 'vendor')):
    return []
  command = ['cargo', 'vendor'] + (
      ['--locked'] if os.path.isfile(os.path.join(repo, 'Cargo.lock')) else []) + ['vendor']
  replacement = base.run_prepare(command, repo, timeout_s)
  # cargo vendor prints the source replacement that makes cargo read vendor/.
  os.makedirs(os.path.join(repo, '.cargo'), exist_ok=True)
  with open(os.path.join(repo, '.cargo', 'config.toml'), 'a', encoding='utf-8') as f:
    f.write('\n' + replacement)
  return [' '.join(command)]


def test_command(repo: str) -> tuple[str, str]:
  return 'cargo test --offline --no-fail-fast', 'cargo'


def is_test_file(rel: str) -> bool:
  return rel.endswith('.rs') and rel.split(os.sep)[0] in ('tests', 'benches')


def is_source_file(rel: str) -> bool:
  parts = rel.split(os.sep)
  return (rel.endswith('.rs') and not is_test_file(rel) and 'src' in parts
          and parts[0] not in ('examples',))


def test_files_for(repo: str, test_ids: list[str]) -> list[str]:
  files = set()
  for test_id in test_ids:
    binary = test_id.split('::')[0]
    for rel in (os.path.join('tests', binary + '.rs'),
                os.path.join('tests', binary, 'main.rs')):
      if os.path.isfile(os.path.join(repo, rel)):
        files.add(rel)
  return sorted(files)


@functools.cache
def inline_test_lines(text: str) -> frozenset[int]:
  """1-based lines of each `#[cfg(test)]` item (its braces matched in the masked code)."""
  code = mutate.code_mask(text, SYNTAX)
  lines = set()
  for match in _CFG_TEST.finditer(code):
    open_at = code.find('{', match.end())
    if open_at < 0:
      continue
    depth, end = 0, len(code)
    for k in range(open_at, len(code)):
      depth += {'{': 1, '}': -1}.get(code[k], 0)
      if depth == 0:
        end = k
        break
    first = code.count('\n', 0, match.start()) + 1
    lines.update(range(first, code.count('\n', 0, end) + 2))
  return frozenset(lines)


LANGUAGE = base.Language(
    name='rust', detect=detect, prepare=prepare, test_command=test_command,
    is_test_file=is_test_file, is_source_file=is_source_file,
    test_files_for=test_files_for,
    toolchain_binds=functools.partial(toolchains.binds, 'rust'), syntax=SYNTAX,
    inline_test_lines=inline_test_lines, ignored_dirs=IGNORED_DIRS, revert=REVERT)
