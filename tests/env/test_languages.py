"""c2jax.env.languages: detection, test commands, test files, the textual mutator, and
one real build per language (Go, Rust, node) whose tasks grade as the RL loop grades."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from c2jax.env import tasks, testlogs
from c2jax.env.languages import LANGUAGES, build_suite, detect, get, mutate, report_path
from c2jax.env.languages import go, node, revert, rust
from env_testlib import grade as _grade, real_docker_engine


def _write(root, files: dict[str, str]) -> str:
  for rel, text in files.items():
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write(text)
  return str(root)


# --- detection and test commands -------------------------------------------------------

@pytest.mark.parametrize('marker, name', [
    ('go.mod', 'go'), ('Cargo.toml', 'rust'), ('package.json', 'node'),
    ('pyproject.toml', 'python'), ('setup.py', 'python')])
def test_detect_by_marker(tmp_path, marker, name):
  assert detect(_write(tmp_path, {marker: '{}'})).name == name


def test_detect_ties_and_misses(tmp_path):
  both = _write(tmp_path / 'both', {'go.mod': 'module x\n', 'package.json': '{}'})
  with pytest.raises(ValueError, match='several languages.*--language'):
    detect(both)
  # A Python checkout with a package.json (docs tooling) stays Python, as it always was.
  assert detect(_write(tmp_path / 'py', {'setup.py': '', 'package.json': '{}'})).name == 'python'
  # No marker at all: Python, whose installer reads requirements files and tox.ini too.
  assert detect(_write(tmp_path / 'none', {'README': ''})).name == 'python'
  sdist = tmp_path / 'pkg-1.0.tar.gz'
  sdist.write_bytes(b'')
  assert detect(str(sdist)).name == 'python'
  with pytest.raises(ValueError, match="choose one of"):
    get('cobol')


@pytest.mark.parametrize('script, command, parser', [
    ('jest', 'npx jest --json', 'jest'),
    ('jest --coverage --verbose tests/', 'npx jest --json tests/', 'jest'),
    ('vitest', 'npx vitest run --reporter=json', 'vitest'),
    ('vitest run --reporter verbose src', 'npx vitest run --reporter=json src', 'vitest'),
    ("mocha --reporter spec 'test/**/*.spec.js'",
     "npx mocha --reporter json 'test/**/*.spec.js'", 'mocha'),
    ('node --test test/', 'node --test --test-reporter=tap test/', 'tap'),
    ('tsc -p . && NODE_ENV=test jest -w', 'npx jest --json', 'jest'),
    ('echo "Error: no test specified" && exit 1', 'node --test --test-reporter=tap', 'tap'),
    # tape prints TAP by itself and expands the globs it is given, quoted or not.
    ("nyc tape 'test/**/*.js'", "npx tape 'test/**/*.js'", 'tape'),
    ('standard && tape test/*.js', "npx tape 'test/*.js'", 'tape'),
    ('nyc --reporter text --reporter=html tape test.js | tap-spec', 'npx tape test.js', 'tape'),
    ('c8 npx tape -r ./setup.js test', 'npx tape -r ./setup.js test', 'tape'),
    ('nyc --reporter=lcov mocha --reporter dot', 'npx mocha --reporter json', 'mocha'),
])
def test_node_test_command(tmp_path, script, command, parser):
  repo = _write(tmp_path, {'package.json': json.dumps({'scripts': {'test': script}})})
  assert node.test_command(repo) == (command, parser)


def test_node_test_command_runs_a_node_script_that_loads_tape_under_tape(tmp_path):
  def command(name, script, files):
    scripts = {'test': script} if isinstance(script, str) else script
    return node.test_command(_write(tmp_path / name, {
        'package.json': json.dumps({'scripts': scripts}), **files}))
  # minimist 1.2.8's scripts: the test script names another.
  minimist = {'test': 'npm run tests-only', 'tests-only': "nyc tape 'test/**/*.js'"}
  assert command('minimist', minimist, {}) == ("npx tape 'test/**/*.js'", 'tape')
  required = "var test = require('tape');\ntest('pads', function (t) { t.end(); });\n"
  assert command('file', 'node test', {'test.js': required}) == ('npx tape test.js', 'tape')
  assert command('dir', 'node test', {'test/index.js': "import test from 'tape';\n"}) == (
      'npx tape test/index.js', 'tape')
  assert command('other', 'node spec.js', {'spec.js': required}) == ('npx tape spec.js',
                                                                      'tape')
  # object-keys 1.1.1's: a manager flag before the script's name, and a test file that
  # loads tape through a local file it requires.
  object_keys = {'test': 'npm run --silent tests-only', 'tests-only': 'node test/index.js'}
  assert command('chain', object_keys, {
      'test/index.js': "require('./shim');\n", 'test/shim.js': required}) == (
          'npx tape test/index.js', 'tape')
  # A node script without tape (or a missing one) is no runner this module knows.
  for name, files in (('no_tape', {'test.js': "require('assert');\n"}), ('missing', {})):
    with pytest.raises(ValueError, match='where FILE requires tape'):
      command(name, 'node test', files)


@pytest.mark.parametrize('manager', ['npm run', 'yarn', 'pnpm'])
def test_node_test_command_follows_named_scripts(tmp_path, manager):
  scripts = {'test': f'{manager} lint && {manager} unit -- --bail', 'lint': 'eslint .',
             'unit': 'vitest --coverage src'}
  repo = _write(tmp_path, {'package.json': json.dumps({'scripts': scripts})})
  assert node.test_command(repo) == ('npx vitest run --reporter=json src --bail', 'vitest')


def test_node_test_command_errors(tmp_path):
  repo = _write(tmp_path / 'make', {'package.json': json.dumps({'scripts': {'test': 'make'}})})
  with pytest.raises(ValueError, match='set scripts.test'):
    node.test_command(repo)
  assert node.test_command(_write(tmp_path / 'bare', {'package.json': '{}'}))[1] == 'tap'


def test_other_test_commands(tmp_path):
  assert go.test_command(str(tmp_path)) == ('GOPROXY=off go test -json -count=1 ./...', 'go')
  assert rust.test_command(str(tmp_path)) == ('cargo test --offline --no-fail-fast', 'cargo')
  command, parser = LANGUAGES['python'].test_command(str(tmp_path))
  assert parser == 'pytest' and 'pytest' in command


@pytest.mark.parametrize('name, tests, sources, neither', [
    ('go', ['calc_test.go', 'x/y_test.go'], ['calc.go', 'x/y.go'], ['README.md']),
    ('rust', ['tests/api.rs', 'benches/b.rs'], ['src/lib.rs', 'crates/a/src/m.rs'],
     ['build.rs', 'examples/demo/src/main.rs']),
    ('node', ['a.test.js', 'src/b.spec.ts', 'test/helper.js', '__tests__/c.jsx', 'test.js',
              'tests.mjs'],
     ['src/index.js', 'lib/m.mjs', 'src/app.tsx', 'lib/testing.js'],
     ['jest.config.js', 'types.d.ts', 'README.md']),
    ('python', ['tests/test_a.py', 'pkg/a_test.py', 'conftest.py'], ['pkg/a.py'],
     ['setup.py']),
])
def test_test_and_source_files(name, tests, sources, neither):
  language = LANGUAGES[name]
  assert all(language.is_test_file(rel) and not language.is_source_file(rel) for rel in tests)
  assert all(language.is_source_file(rel) and not language.is_test_file(rel)
             for rel in sources)
  assert not any(language.is_source_file(rel) or language.is_test_file(rel)
                 for rel in neither)


def test_test_files_for(tmp_path):
  repo = _write(tmp_path / 'g', {
      'go.mod': 'module example.com/calc\n', 'add_test.go': 'func TestAdd(t *testing.T) {}\n',
      'sub/sub_test.go': 'func TestSub(t *testing.T) {}\n'})
  assert go.test_files_for(repo, ['example.com/calc/TestAdd/case_1']) == ['add_test.go']
  assert go.test_files_for(repo, ['example.com/calc/sub/TestSub']) == ['sub/sub_test.go']
  repo = _write(tmp_path / 'r', {'tests/api.rs': '', 'src/lib.rs': ''})
  assert rust.test_files_for(repo, ['api::adds', 'calc::tests::adds']) == ['tests/api.rs']
  repo = _write(tmp_path / 'n', {'test/a.test.js': "test('adds', () => {});\n",
                                 'test/b.test.js': "test('other', () => {});\n"})
  assert node.test_files_for(repo, ['adds > inner']) == ['test/a.test.js']
  assert node.test_files_for(repo, ['test/b.test.js > suite > t']) == ['test/b.test.js']
  # tape: an id is one test's name, which may hold ' > ' itself; test.js is a test file.
  repo = _write(tmp_path / 't', {
      'test.js': "test('a > b', function (t) { t.end(); });\n",
      'test/a.js': 'test("a", function (t) { t.end(); });\n',
      'test/both.js': "test(`shared`, (t) => t.end());\ntest('a', (t) => t.end());\n",
      'lib/shared.js': "exports.name = 'shared';\n"})
  assert node.test_files_for(repo, ['a > b']) == ['test.js']
  assert node.test_files_for(repo, ['a']) == ['test/a.js', 'test/both.js']
  assert node.test_files_for(repo, ['shared', 'missing']) == ['test/both.js']


# --- the textual mutator ---------------------------------------------------------------

_GO = '''package calc

import "fmt"

// Max returns b when a < b.
func Max(a, b int) int {
\tif a < b { // a > b here is a comment
\t\treturn b
\t}
\ts := "x < y && true"
\tr := `raw
a == b`
\treturn a + 1
}
'''

_RUST = '''pub fn first<'a>(s: &'a str, n: usize) -> &'a str {
    let c = '<';
    if n >= s.len() && c != 'x' { return s; }
    let f = move || n == 0;
    &s[..n]
}

#[cfg(test)]
mod tests {
    #[test]
    fn t() { assert!(1 < 2); }
}
'''

_JS = '''const { helper } = require('./helper');
import x from "y";
/* a && b
   c < d */
export function f(a, b, i) {
  const msg = `${a < b}`;
  i++;
  const y = a || b && true;
  return a >= b ? 0x1f : x2 + 1.5;
}
'''


def _edits(rel, text, language):
  return [(e.line, e.kind, e.after) for e in mutate.line_edits(
      rel, text, language.syntax, language.inline_test_lines(text))]


def test_mutator_go_leaves_comments_and_strings():
  assert _edits('calc.go', _GO, LANGUAGES['go']) == [
      (7, 'flip_comparison', '\tif a >= b { // a > b here is a comment'),
      (13, 'change_operator', '\treturn a - 1'),
      (13, 'off_by_one', '\treturn a + 2'),
      (13, 'off_by_one', '\treturn a + 0'),
  ]


def test_mutator_rust_chars_lifetimes_closures_and_inline_tests():
  assert rust.inline_test_lines(_RUST) == frozenset(range(8, 13))
  assert _edits('src/lib.rs', _RUST, LANGUAGES['rust']) == [
      (3, 'flip_comparison', "    if n < s.len() && c != 'x' { return s; }"),
      (3, 'flip_logical', "    if n >= s.len() || c != 'x' { return s; }"),
      (3, 'flip_comparison', "    if n >= s.len() && c == 'x' { return s; }"),
      (4, 'flip_comparison', '    let f = move || n != 0;'),  # the closure's || is kept
      (4, 'off_by_one', '    let f = move || n == 1;'),
  ]


def test_mutator_js_imports_templates_and_literals():
  assert _edits('f.js', _JS, LANGUAGES['node']) == [
      (8, 'flip_logical', '  const y = a && b && true;'),
      (8, 'flip_logical', '  const y = a || b || true;'),
      (8, 'flip_boolean', '  const y = a || b && false;'),
      (9, 'flip_comparison', '  return a < b ? 0x1f : x2 + 1.5;'),
      (9, 'change_operator', '  return a >= b ? 0x1f : x2 - 1.5;'),
  ]


def test_edit_changes_one_line_and_choice_is_seeded():
  edits = mutate.line_edits('calc.go', _GO, go.SYNTAX)
  for edit in edits:
    before, after = _GO.split('\n'), edit.mutated.split('\n')
    assert [i for i, (x, y) in enumerate(zip(before, after)) if x != y] == [edit.line - 1]
  first = mutate.choose(edits, seed=3)
  assert first == mutate.choose(edits, seed=3)
  assert sorted(e.line for e in first) == [7, 13]  # one edit per line
  assert {tuple(e.line for e in mutate.choose(edits, seed=s)) for s in range(20)} == {
      (7, 13), (13, 7)}


# --- reverts -------------------------------------------------------------------------------

_GO_FUNCS = '''package calc

type S struct{ n int }

func (s *S) Clamp(x, lo, hi int) int {
\tif x < lo { // {
\t\treturn lo
\t}
\treturn x
}

func Any(x interface{}) interface{} {
\ts := "}"
\treturn x
}

func One() int { return 1 }

func main() {
\tprintln(1)
\tprintln(2)
}
'''

_RUST_FUNCS = '''pub trait Shape {
    fn area(&self) -> f64;
}
pub(crate) const fn clamp<T: Copy>(x: T, lo: T) -> T where T: PartialOrd {
    let _ = lo;
    x
}
#[cfg(test)]
mod tests {
    fn helper() {
        let a = 1;
        let b = 2;
    }
}
'''

_JS_FUNCS = '''export async function clamp(x, lo = {a: 1}, hi) {
  if (x < lo) return lo;
  return x > hi ? hi : x;
}
class Cache {
  constructor() {
    this.a = 1;
    this.b = 2;
  }
  static get(key) {
    const v = this.m[key];
    return v;
  }
}
describe('x', () => {
  a();
  b();
});
'''


def _reverts(text, name, rel='f'):
  language = LANGUAGES[name]
  return revert.reverts(rel, text, language.syntax, language.revert,
                        language.inline_test_lines(text))


def test_go_revert_replaces_the_body_only():
  found = _reverts(_GO_FUNCS, 'go')
  assert [(e.function, e.line) for e in found] == [('Clamp', 5), ('Any', 12)]
  assert found[0].mutated == _GO_FUNCS.replace(
      '\tif x < lo { // {\n\t\treturn lo\n\t}\n\treturn x\n',
      '\tpanic("not implemented")\n')
  assert found[1].mutated == _GO_FUNCS.replace('\ts := "}"\n\treturn x\n',
                                               '\tpanic("not implemented")\n')


def test_rust_and_js_reverts_skip_declarations_tests_and_constructors():
  (clamp,) = _reverts(_RUST_FUNCS, 'rust')
  assert (clamp.function, clamp.line) == ('clamp', 4)
  assert '-> T where T: PartialOrd {\n    todo!()\n}\n#[cfg(test)]' in clamp.mutated
  found = _reverts(_JS_FUNCS, 'node')
  assert [(e.function, e.line) for e in found] == [('clamp', 1), ('get', 10)]
  assert found[1].mutated.count("throw new Error('not implemented');") == 1
  assert "  static get(key) {\n    throw new Error('not implemented');\n  }\n}" in (
      found[1].mutated)


# --- one real build per language ---------------------------------------------------------

_GO_PROJECT = {
    'go.mod': 'module example.com/calc\n\ngo 1.19\n',
    'calc.go': ('package calc\n\nfunc Add(a, b int) int { return a + b }\n\n'
                'func IsSmall(n int) bool { return n < 10 }\n'),
    'add_test.go': ('package calc\n\nimport "testing"\n\nfunc TestAdd(t *testing.T) {\n'
                    '\tif Add(2, 3) != 5 {\n\t\tt.Fatal("2 + 3")\n\t}\n}\n'),
    'small_test.go': ('package calc\n\nimport "testing"\n\nfunc TestIsSmall(t *testing.T) {\n'
                      '\tif !IsSmall(9) || IsSmall(10) {\n\t\tt.Fatal("9 and 10")\n\t}\n}\n'),
}
_RUST_PROJECT = {
    'Cargo.toml': '[package]\nname = "calc"\nversion = "0.1.0"\nedition = "2021"\n',
    'src/lib.rs': ('pub fn add(a: i32, b: i32) -> i32 { a + b }\n\n'
                   'pub fn is_small(n: i32) -> bool { n < 10 }\n\n'
                   '#[cfg(test)]\nmod tests {\n    #[test]\n    fn adds() {\n'
                   '        assert_eq!(super::add(2, 3), 5);\n    }\n}\n'),
    'tests/small.rs': ('#[test]\nfn small() {\n    assert!(calc::is_small(9));\n'
                       '    assert!(!calc::is_small(10));\n}\n'),
}
_NODE_PROJECT = {
    'package.json': json.dumps({'name': 'calc', 'scripts': {'test': 'node --test'}}),
    'lib/calc.js': ('exports.add = (a, b) => a + b;\n'
                    'exports.isSmall = (n) => n < 10;\n'
                    'exports.untested = (n) => n * 2 + 1;\n'),
    'test/add.test.js': ("const test = require('node:test');\n"
                         "const assert = require('node:assert');\n"
                         "const { add } = require('../lib/calc');\n"
                         "test('add', () => assert.strictEqual(add(2, 3), 5));\n"),
    'test/small.test.js': ("const test = require('node:test');\n"
                           "const assert = require('node:assert');\n"
                           "const { isSmall } = require('../lib/calc');\n"
                           "test('isSmall', () => {\n  assert.ok(isSmall(9));\n"
                           "  assert.ok(!isSmall(10));\n});\n"),
    # Passes on the first run of a tree and fails on the second: flaky, never a task's.
    'test/flaky.test.js': ("const test = require('node:test');\n"
                           "const assert = require('node:assert');\n"
                           "const fs = require('node:fs');\n"
                           "test('flaky', () => {\n"
                           "  const seen = fs.existsSync('.runs');\n"
                           "  const runs = seen ? Number(fs.readFileSync('.runs')) : 0;\n"
                           "  fs.writeFileSync('.runs', String(runs + 1));\n"
                           "  assert.strictEqual(runs % 2, 0);\n});\n"),
}
# (project, tools, {edited line: (FAIL_TO_PASS, test file hidden or None)}, lines of
# calc's source no test catches)
_CASES = {
    'go': (_GO_PROJECT, ('go',), {
        3: (['example.com/calc/TestAdd'], 'add_test.go'),
        5: (['example.com/calc/TestIsSmall'], 'small_test.go')}, ()),
    'rust': (_RUST_PROJECT, ('cargo', 'rustc'), {
        1: (['calc::tests::adds'], None),  # an inline test: it stays in the repository
        3: (['small::small'], 'tests/small.rs')}, ()),
    'node': (_NODE_PROJECT, ('node',), {
        1: (['add'], 'test/add.test.js'),
        2: (['isSmall'], 'test/small.test.js')}, (3,)),
}


def _skip_without(name, tools):
  missing = [t for t in tools + ('bwrap',) if shutil.which(t) is None]
  if missing:
    pytest.skip(f'{missing} not installed: needed to build {name} tasks')


def _check_task(name, record, task, fail_to_pass, hidden, pass_to_pass_count=1):
  """The record's tests are right, its test files are hidden, the task fails as given
  and passes with its gold patch, graded as the RL loop grades."""
  assert record['language'] == name
  assert record['test_parser'] == LANGUAGES[name].test_command(task.repo)[1]
  assert json.loads(record['FAIL_TO_PASS']) == fail_to_pass
  assert len(json.loads(record['PASS_TO_PASS'])) == pass_to_pass_count
  if hidden:
    assert not os.path.exists(os.path.join(task.repo, hidden))
    assert f'+++ b/{hidden}' in record['test_patch']
  else:
    assert record['test_patch'] == ''
  assert task.language == name
  unsolved = _grade(task, '')
  assert unsolved.reward == 0.0
  assert [t for t, ok in unsolved.passed.items() if not ok] == fail_to_pass
  solved = _grade(task, record['patch'])
  assert solved.reward == 1.0, solved.output[-2000:]


def _load(out):
  return {t.id: t for t in tasks.load_swebench_jsonl(out, out[:-len('.jsonl')] + '.repos')}


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(_CASES))
def test_build_and_grade(tmp_path, name):
  project, tools, expected, uncaught = _CASES[name]
  _skip_without(name, tools)
  repo = _write(tmp_path / 'calc', project)
  out = str(tmp_path / 'out' / 'suite.jsonl')
  records = build_suite(repo, out, kinds=('mutate',), max_tasks=3, max_candidates=4,
                        timeout_s=120)
  assert [r['created_by'] for r in records] == ['mutate', 'mutate']
  report = json.loads(open(report_path(out)).read())
  assert report['language'] == name and report['baseline']['passed'] == 2
  assert report['baseline']['flaky'] == (['flaky'] if name == 'node' else [])
  tried = {c['line']: c for c in report['candidates']}
  assert sorted(tried) == sorted([*expected, *uncaught])
  assert {line for line, c in tried.items() if c['kept']} == set(expected)
  for line in uncaught:
    assert tried[line]['reason'] == 'no baseline-passing test failed in both runs'
  loaded = _load(out)
  for record in records:
    line = next(c['line'] for c in report['candidates']
                if c.get('instance_id') == record['instance_id'])
    _check_task(name, record, loaded[record['instance_id']], *expected[line])


# (project, tools, reverted function, FAIL_TO_PASS, hidden test file, PASS_TO_PASS
# count). Go's stub panics, which ends the package's test binary: TestDouble, run after
# TestClamp, is never seen on the edited tree, so it is not a PASS_TO_PASS test.
_REVERT_PROJECTS = {
    'go': ({
        'go.mod': 'module example.com/calc\n\ngo 1.19\n',
        'calc.go': ('package calc\n\nfunc Clamp(x, lo, hi int) int {\n\tif x < lo {\n'
                    '\t\treturn lo\n\t}\n\tif x > hi {\n\t\treturn hi\n\t}\n\treturn x\n}\n\n'
                    'func Double(x int) int {\n\treturn 2 * x\n}\n'),
        'clamp_test.go': ('package calc\n\nimport "testing"\n\nfunc TestClamp(t *testing.T) {\n'
                          '\tif Clamp(-1, 0, 5) != 0 || Clamp(9, 0, 5) != 5 {\n'
                          '\t\tt.Fatal("clamp")\n\t}\n}\n'),
        'double_test.go': ('package calc\n\nimport "testing"\n\nfunc TestDouble(t *testing.T) {\n'
                           '\tif Double(4) != 8 {\n\t\tt.Fatal("double")\n\t}\n}\n'),
    }, ('go',), 'Clamp', ['example.com/calc/TestClamp'], 'clamp_test.go', 0),
    'rust': ({
        'Cargo.toml': '[package]\nname = "calc"\nversion = "0.1.0"\nedition = "2021"\n',
        'src/lib.rs': ('pub fn clamp(x: i32, lo: i32, hi: i32) -> i32 {\n    if x < lo {\n'
                       '        return lo;\n    }\n    x.min(hi)\n}\n\n'
                       'pub fn double(x: i32) -> i32 {\n    2 * x\n}\n\n'
                       '#[cfg(test)]\nmod tests {\n    #[test]\n    fn doubles() {\n'
                       '        assert_eq!(super::double(4), 8);\n'
                       '        assert_eq!(super::double(0), 0);\n    }\n}\n'),
        'tests/clamp.rs': ('#[test]\nfn clamps() {\n    assert_eq!(calc::clamp(-1, 0, 5), 0);\n'
                           '    assert_eq!(calc::clamp(9, 0, 5), 5);\n}\n'),
    }, ('cargo', 'rustc'), 'clamp', ['clamp::clamps'], 'tests/clamp.rs', 1),
    'node': ({
        'package.json': json.dumps({'name': 'calc', 'scripts': {'test': 'node --test'}}),
        'lib/calc.js': ('function clamp(x, lo, hi) {\n  if (x < lo) return lo;\n'
                        '  return x > hi ? hi : x;\n}\n'
                        'const double = (x) => 2 * x;\nmodule.exports = { clamp, double };\n'),
        'test/clamp.test.js': ("const test = require('node:test');\n"
                               "const assert = require('node:assert');\n"
                               "const { clamp } = require('../lib/calc');\n"
                               "test('clamp', () => assert.strictEqual(clamp(9, 0, 5), 5));\n"),
        'test/double.test.js': ("const test = require('node:test');\n"
                                "const assert = require('node:assert');\n"
                                "const { double } = require('../lib/calc');\n"
                                "test('double', () => assert.strictEqual(double(4), 8));\n"),
    }, ('node',), 'clamp', ['clamp'], 'test/clamp.test.js', 1),
}


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(_REVERT_PROJECTS))
def test_revert_build_and_grade(tmp_path, name):
  project, tools, function, fail_to_pass, hidden, pass_to_pass_count = _REVERT_PROJECTS[name]
  _skip_without(name, tools)
  repo = _write(tmp_path / 'calc', project)
  out = str(tmp_path / 'out' / 'suite.jsonl')
  (record,) = build_suite(repo, out, kinds=('revert',), timeout_s=120)
  assert record['created_by'] == 'revert'
  assert record['problem_statement'].startswith(f'Implement `{function}` in ')
  removed = [line[1:].strip() for line in record['patch'].splitlines()
             if line.startswith('-') and not line.startswith('---')]
  assert removed == [LANGUAGES[name].revert.stub]  # the gold patch takes the stub out
  task = _load(out)[record['instance_id']]
  _check_task(name, record, task, fail_to_pass, hidden, pass_to_pass_count)
  # In the docker engine, from the language's environment image (c2jax/env/env_images.py:
  # the host's toolchain on the sandbox image, built once); Go's runs in
  # test_multilang_suite.py.
  if name != 'go' and not real_docker_engine():
    unsolved = _grade(task, '', 'docker')
    assert unsolved.reward == 0.0 and not any(unsolved.passed[t] for t in fail_to_pass)
    solved = _grade(task, record['patch'], 'docker')
    assert solved.reward == 1.0, solved.output[-2000:]


def test_build_refuses_python_and_reports_a_run_without_tests(tmp_path):
  with pytest.raises(ValueError, match='c2jax tasks install'):
    build_suite(_write(tmp_path / 'py', {'setup.py': ''}), str(tmp_path / 's.jsonl'))
  if shutil.which('node') is None or shutil.which('bwrap') is None:
    pytest.skip('node or bwrap not installed: the empty run needs them')
  repo = _write(tmp_path / 'js', {'package.json': '{}', 'lib/a.js': 'exports.a = 1 + 1;\n'})
  out = str(tmp_path / 'js.jsonl')
  with pytest.raises(testlogs.NoTestsSeen, match='No test of'):
    build_suite(repo, out, timeout_s=60)
  assert json.loads(open(report_path(out)).read())['baseline']['passed'] == 0


def test_an_edit_that_hangs_the_tests_is_dropped_in_a_bounded_time(tmp_path, monkeypatch):
  if shutil.which('node') is None or shutil.which('bwrap') is None:
    pytest.skip('node or bwrap not installed')
  from c2jax.env.languages import build
  monkeypatch.setattr(build, 'CANDIDATE_TIMEOUT_FLOOR_S', 3.0)
  # The loop's step made `i - 1` or `i + 0` never ends.
  repo = _write(tmp_path / 'js', {
      'package.json': json.dumps({'scripts': {'test': 'node --test'}}),
      'lib/steps.js': ('function steps(n) {\n  let i = 0;\n  while (i < n) {\n'
                       '    i = i + 1;\n  }\n  return i;\n}\nmodule.exports = { steps };\n'),
      'test/steps.test.js': ("const test = require('node:test');\n"
                             "const assert = require('node:assert');\n"
                             "const { steps } = require('../lib/steps');\n"
                             "test('steps', () => assert.strictEqual(steps(3), 3));\n")})
  out = str(tmp_path / 'out.jsonl')
  started = time.monotonic()
  build_suite(repo, out, kinds=('mutate',), max_tasks=10, timeout_s=120)
  report = json.loads(open(report_path(out)).read())
  assert report['baseline']['candidate_timeout_s'] == 3.0
  (hung,) = [c for c in report['candidates'] if c['line'] == 4]
  assert hung['after'].strip() in ('i = i - 1;', 'i = i + 0;') and not hung['kept']
  assert hung['reason'].startswith('the tests did not end within 3 s')
  assert time.monotonic() - started < 60  # not the 120 s of timeout_s, twice


# --- the command line --------------------------------------------------------------------

def _cli(*args):
  return subprocess.run([sys.executable, '-m', 'c2jax.cli', 'tasks', *args],
                        capture_output=True, text=True, timeout=300)


def test_cli_picks_the_language_and_refuses_what_does_not_fit(tmp_path):
  repo = _write(tmp_path / 'calc', _GO_PROJECT)
  out = str(tmp_path / 'suite.jsonl')
  refused = _cli('build', f'--repo={repo}', f'--out={out}', '--kinds=mutate,rewrite')
  assert refused.returncode == 2 and "Unknown task kind(s) ['rewrite'] for go" in refused.stderr
  refused = _cli('install', f'--repo={repo}')
  assert refused.returncode == 2 and 'is a go repository' in refused.stderr
  refused = _cli('build', f'--repo={repo}', f'--out={out}', '--language=rust')
  assert refused.returncode == 2 and 'is not a rust repository' in refused.stderr
  assert not os.path.exists(out)


@pytest.mark.slow
def test_cli_builds_a_node_suite(tmp_path):
  if shutil.which('node') is None or shutil.which('bwrap') is None:
    pytest.skip('node or bwrap not installed: needed to build node tasks')
  repo = _write(tmp_path / 'calc', _NODE_PROJECT)
  out = str(tmp_path / 'suite.jsonl')
  built = _cli('build', f'--repo={repo}', f'--out={out}', '--max_tasks=1')
  assert built.returncode == 0, built.stderr[-2000:]
  summary = json.loads(built.stdout.strip().splitlines()[-1])
  assert summary == {'suite': out, 'language': 'node', 'tasks': 1,
                     'by_kind': {'mutate': 1, 'revert': 0}, 'report': report_path(out)}
  (record,) = [json.loads(line) for line in open(out)]
  assert record['test_command'] == 'node --test --test-reporter=tap'
  assert record['created_by'] == 'mutate' and '.mutate.' in record['instance_id']
