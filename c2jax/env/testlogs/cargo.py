"""Rust: `cargo test` with libtest's default (pretty) output, any number of test binaries.

       Running unittests src/lib.rs (target/debug/deps/calc-c6626fb655a8d231)
  running 3 tests
  test tests::adds ... ok
  test tests::panics - should panic ... ok
  test tests::slow ... ignored, needs the network
  test tests::subtracts_wrongly ... FAILED
  test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; ...
       Running tests/api.rs (target/debug/deps/api-14943844c8ca6ed4)
     Doc-tests calc
  test src/lib.rs - add (line 3) ... ok

An id is the binary's name (the crate for unit and doc tests, the file's stem for an
integration test: what `cargo test --lib` / `--test api` / `--doc` pick) and the test's
path, joined with '::' ('calc::tests::adds', 'api::api_adds', 'calc::src/lib.rs - add
(line 3)'); without `Running` lines (a test binary run by hand), the path alone. A lib
and a bin of one package share a name: their unit tests share the namespace.
ignored -> skipped; a benchmark run as a test (`bench:`) passed.

Each binary announces `running N tests` and ends with `test result:`. A binary that died
in between (std::process::abort, a signal, a panic outside a test) leaves cargo's
`process didn't exit successfully: ... (signal: 6, SIGABRT: ...)`; a log that stops in
between was killed or timed out; a crate that did not compile fails under its name
(`could not compile `calc``). Use `--no-fail-fast`, or cargo stops at the first binary
with a failure and the others' tests are absent. `cargo test -q` prints a dot per test
instead of its name: the parser notes that it cannot name them.
"""

from __future__ import annotations

import os
import re

from c2jax.env.testlogs import report as report_lib

_RUNNING = re.compile(r'^\s+Running (?:unittests )?\S.*? \((.+)\)$')
_DOC_TESTS = re.compile(r'^\s+Doc-tests (\S+)$')
_COUNT = re.compile(r'^running (\d+) tests?$')
_TEST = re.compile(r'^test (.+?) \.\.\. ?(.*)$')
_SLOW = re.compile(r'^test (.+) has been running for over \d+ seconds$')
_RESULT = re.compile(r'^test result: (?:ok|FAILED)\.')
_DIED = re.compile(r"process didn't exit successfully: .*\((.+)\)\s*$")
_NOT_COMPILED = re.compile(r'^error: could not compile `([^`]+)`(?: \(([^)]+)\))?')
_BINARY_HASH = re.compile(r'-[0-9a-f]{16}(\.exe)?$')


def _outcome(result: str) -> str | None:
  if result == 'ok' or result.startswith('bench:'):
    return report_lib.PASSED
  if result == 'FAILED':
    return report_lib.FAILED
  if result == 'ignored' or result.startswith('ignored,'):
    return report_lib.SKIPPED
  return None


class _Binary:
  """The test binary whose output is being read."""

  def __init__(self, name: str):
    self.name = name
    self.expected: int | None = None  # set by `running N tests`, None once it ended
    self.named = 0
    self.started: dict[str, None] = {}

  def test_id(self, path: str) -> str:
    return f'{self.name}::{path}' if self.name else path


def parse(text: str) -> report_lib.TestReport:
  builder = report_lib.ReportBuilder('cargo')
  binary = _Binary('')

  def close(why: str) -> None:
    """The binary's output ended without its `test result:` line."""
    for test_id in binary.started:
      builder.add(test_id, report_lib.FAILED)
    running = f' ({", ".join(binary.started)} running)' if binary.started else ''
    builder.cut_short(f'{binary.name or "test binary"}: {why} after {binary.named} of '
                      f'{binary.expected} tests{running}')
    binary.expected = None

  for line in text.splitlines():
    if (match := _RUNNING.match(line)) or (match := _DOC_TESTS.match(line)):
      if binary.expected is not None:
        close('the output stopped')
      binary = _Binary(_BINARY_HASH.sub('', os.path.basename(match.group(1))))
    elif match := _COUNT.match(line):
      binary.expected, binary.named, binary.started = int(match.group(1)), 0, {}
    elif match := _TEST.match(line):
      path = match.group(1).removesuffix(' - should panic')
      status = _outcome(match.group(2))
      if status is not None:
        builder.add(binary.test_id(path), status)
        binary.named += 1
        binary.started.pop(binary.test_id(path), None)
      elif not match.group(2) or match.group(2).startswith('error:'):
        binary.started[binary.test_id(path)] = None  # --test-threads=1: name, then result
    elif match := _SLOW.match(line):
      binary.started[binary.test_id(match.group(1))] = None
    elif _RESULT.match(line):
      if binary.expected is not None and binary.named < binary.expected:
        builder.note(f'{binary.name}: {binary.expected} tests ran and {binary.named} '
                     'were named (`cargo test -q` prints dots): run cargo test without -q')
      binary.expected = None
    elif (match := _DIED.search(line)) and binary.expected is not None:
      # (After `test result:` the same line only reports the failures' exit status 101.)
      close(f'the binary died ({match.group(1)})')
    elif match := _NOT_COMPILED.match(line):
      crate, target = match.group(1), match.group(2) or 'crate'
      builder.add(crate, report_lib.FAILED)
      builder.cut_short(f'{crate} ({target}) failed to compile')
  if binary.expected is not None:
    close('the log ends (killed or timed out)')
  return builder.report()
