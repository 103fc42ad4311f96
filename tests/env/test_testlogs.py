"""Test log parsers on real logs of each runner (tests/fixtures/testlogs/, made by
tools/fixtures/make_testlogs.py), and the grading that uses them.

The expected statuses are written out by hand from reading each log, never produced by
the parser under test.
"""

import dataclasses
import json
import pathlib

import pytest

from c2jax.env import reward, sandbox_base, tasks, testlogs
from c2jax.env.testlogs import report as report_lib
from tools.fixtures import make_testlogs

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / 'fixtures' / 'testlogs'
P, F, S = 'passed', 'failed', 'skipped'


@dataclasses.dataclass(frozen=True)
class Expected:
  statuses: dict
  complete: bool = True
  problem_words: tuple = ()  # each must appear in some problem of the report


_MIXED_PYTEST = {
    'tests/test_mixed.py::test_add': P,
    'tests/test_mixed.py::test_sub_is_wrong': F,
    'tests/test_mixed.py::test_equal[1-1]': P,
    'tests/test_mixed.py::test_equal[1-2]': F,
    'tests/test_mixed.py::test_equal[x y-x y]': P,
    'tests/test_mixed.py::test_known_bug': P,    # XFAIL: failed as declared
    'tests/test_mixed.py::test_fixed_bug': F,    # XPASS: passed against its declaration
    'tests/test_mixed.py::test_uses_broken': F,  # ERROR in its fixture
    'tests/test_mixed.py::TestGroup::test_method': P,
}
_MIXED_JEST = {
    'test/math.test.js > math > adds': P,
    'test/math.test.js > math > subtracts wrongly': F,
    'test/math.test.js > math > division > divides': P,
    'test/math.test.js > math > division > by zero': S,
    'test/math.test.js > math > multiplies': S,
    'test/math.test.js > top level': P,
    'test/noisy.test.js > upper case': P,
}
_NO_JSON = ('no JSON report',)

EXPECTED = {
    # pytest -rA -q names a skipped test by its location only.
    ('pytest', 'summary'): Expected({**_MIXED_PYTEST, 'tests/test_mixed.py:17': S}),
    ('pytest', 'verbose'): Expected({**_MIXED_PYTEST,
                                     'tests/test_mixed.py::test_skipped': S}),
    ('pytest', 'crash'): Expected({}, False, ("final counts line",)),
    ('pytest', 'timeout'): Expected({'tests/test_hang.py::test_fast': P,
                                     'tests/test_hang.py::test_hangs': F}, False,
                                    ('tests/test_hang.py::test_hangs started and never',)),
    ('pytest', 'collection_error'): Expected({'tests/test_broken.py': F}, False,
                                             ('Interrupted: 1 error during collection',)),
    ('pytest', 'empty'): Expected({}),
    ('tap', 'mixed'): Expected({
        'math > adds': P, 'math > subtracts wrongly': F, 'math > division > divides': P,
        'math > division > by zero': S, 'math > division': P, 'math > multiplies': S,
        'math': F, 'with subtests > first': P, 'with subtests > second # has a hash': F,
        'with subtests': F, 'skipped with a reason': S, 'todo that fails': S,
        'upper case': P}),
    # node lost the file's finished tests with its process; the file itself failed.
    ('tap', 'crash'): Expected({'test/crash.test.js': F, 'upper case': P}, False,
                               ('test/crash.test.js: its process exited with code 1',)),
    ('tap', 'timeout'): Expected({'fast': P}, False, ('final plan line',)),
    ('tap', 'empty'): Expected({}),
    # 'shared name' passes in basic.js and fails in math.js: one id, its worst status.
    # test.skip('skipped', ...) prints nothing; a reason follows a skipped test's name.
    ('tape', 'mixed'): Expected({
        'upper case': P, 'shared name': F, 'adds': P, 'subtracts wrongly': F,
        'skipped with a reason not on this platform': S, 'todo that fails': S,
        'one assertion skipped': P, 'only skipped assertions': S, 'with subtests': P,
        'first': P, 'second # has a hash': F, 'no assertions': P,
        'plans two, makes one': F}),
    ('tape', 'crash'): Expected({'upper case': P, 'shared name': P, 'before the exit': P,
                                 'exits the process': F}, False,
                                ('exits the process started and never finished',
                                 'final plan line')),
    # process.exit(0): tape names each test that never ended, then closes its plan.
    ('tape', 'exit_zero'): Expected({'before the exit': P, 'exits the process': F,
                                     'after the exit': F}, False,
                                    ('after the exit never ended',)),
    ('tape', 'uncaught'): Expected({'upper case': P, 'shared name': P,
                                    'schedules a throw': P, 'waits': F}, False,
                                   ('waits started and never finished', 'final plan line')),
    ('tape', 'timeout'): Expected({'fast': P, 'hangs': F}, False,
                                  ('hangs started and never finished',)),
    ('tape', 'empty'): Expected({}),
    ('jest', 'mixed'): Expected(_MIXED_JEST),
    ('jest', 'crash'): Expected({}, False, _NO_JSON),  # process.exit ends jest itself
    ('jest', 'timeout'): Expected({}, False, _NO_JSON),
    ('jest', 'suite_error'): Expected({'test/broken.test.js': F,
                                       'test/noisy.test.js > upper case': P}, False,
                                      ("Cannot find module '../src/missing'",)),
    ('jest', 'empty'): Expected({}, False, _NO_JSON),  # jest 30 prints no report then
    ('vitest', 'mixed'): Expected(_MIXED_JEST),
    # A killed worker: vitest reports its tests 'pending' and the run a success.
    ('vitest', 'crash'): Expected({'test/crash.test.js > before the kill': F,
                                   'test/crash.test.js > kills its process': F,
                                   'test/crash.test.js > after the kill': F,
                                   'test/noisy.test.js > upper case': P}, False,
                                  ('test/crash.test.js: 3 of its tests never finished',)),
    ('vitest', 'timeout'): Expected({}, False, _NO_JSON),
    ('vitest', 'suite_error'): Expected({'test/broken.test.js': F,
                                         'test/noisy.test.js > upper case': P}, False,
                                        ("Cannot find module '../src/missing.js'",)),
    ('vitest', 'empty'): Expected({}),
    ('mocha', 'mixed'): Expected({
        'test/noisy.spec.js > upper case': P,
        'test/math.spec.js > math adds': P,
        'test/math.spec.js > math subtracts wrongly': F,
        'test/math.spec.js > math division divides': P,
        'test/math.spec.js > math division by zero': S,
        'test/math.spec.js > math multiplies': S,
        'test/math.spec.js > database "before all" hook for "reads"': F},
        True, ('the tests it guards did not run',)),
    ('mocha', 'crash'): Expected({}, False, _NO_JSON),
    ('mocha', 'timeout'): Expected({}, False, _NO_JSON),
    ('mocha', 'empty'): Expected({}, False, _NO_JSON),
    ('go', 'mixed'): Expected({
        'example.com/calc/strs/TestUpper': P, 'example.com/calc/TestAdd': P,
        'example.com/calc/TestSubWrong': F, 'example.com/calc/TestTable': F,
        'example.com/calc/TestTable/equal': P, 'example.com/calc/TestTable/not_equal': F,
        'example.com/calc/TestSkipped': S, 'example.com/calc/TestParallelA': P,
        'example.com/calc/TestParallelB': P}),
    ('go', 'crash'): Expected({
        'example.com/calc/exit/TestBefore': P, 'example.com/calc/exit/TestExits': F,
        'example.com/calc/panics/TestBefore': P,
        'example.com/calc/panics/TestGoroutinePanics': F,
        'example.com/calc/strs/TestUpper': P}, False,
        ('example.com/calc/exit died while TestExits ran',
         'panic: boom in a goroutine')),
    ('go', 'killed'): Expected({'example.com/calc/TestFast': P,
                                'example.com/calc/TestHangs': F}, False,
                               ('before package example.com/calc finished',)),
    ('go', 'timeout'): Expected({'example.com/calc/TestFast': P,
                                 'example.com/calc/TestHangs': F}, False,
                                ('panic: test timed out after 2s',)),
    ('go', 'build_error'): Expected({'example.com/calc': F,
                                     'example.com/calc/strs/TestUpper': P}, False,
                                    ('package example.com/calc failed to build: '
                                     './calc.go:3:37: undefined: c',)),
    ('go', 'empty'): Expected({}),
    ('cargo', 'mixed'): Expected({
        'calc::tests::adds': P, 'calc::tests::subtracts_wrongly': F,
        'calc::tests::slow': S, 'calc::tests::online': S, 'calc::tests::panics': P,
        'api::api_adds': P, 'api::api_fails': F,
        'calc::src/lib.rs - add (line 3)': P, 'calc::src/lib.rs - sub (line 12)': F}),
    ('cargo', 'abort'): Expected({'calc::tests::before': P, 'api::api_adds': P}, False,
                                 ('SIGABRT', 'after 1 of 3 tests')),
    ('cargo', 'timeout'): Expected({'calc::tests::fast': P}, False,
                                   ('the log ends (killed or timed out) after 1 of 2',)),
    ('cargo', 'compile_error'): Expected({'calc': F}, False,
                                         ('calc (lib test) failed to compile',)),
    ('cargo', 'empty'): Expected({}),
}


def _log(parser: str, case: str) -> str:
  return (FIXTURES / parser / f'{case}.log').read_text()


def test_every_fixture_has_an_expectation_and_every_parser_fixtures():
  on_disk = {(path.parent.name, path.stem) for path in FIXTURES.glob('*/*.log')}
  assert on_disk == set(EXPECTED)
  assert {parser for parser, _ in EXPECTED} == set(testlogs.PARSERS)
  for parser in testlogs.PARSERS:  # every runner: a crash or timeout, and an empty run
    assert any(not e.complete for (p, _), e in EXPECTED.items() if p == parser)
    assert (parser, 'empty') in EXPECTED


@pytest.mark.parametrize('parser, case', sorted(EXPECTED))
def test_real_log(parser, case):
  expected = EXPECTED[parser, case]
  report = testlogs.parse(parser, _log(parser, case))
  assert report.statuses == expected.statuses
  assert report.complete == expected.complete, report.problems
  for words in expected.problem_words:
    assert any(words in problem for problem in report.problems), (words, report.problems)
  if expected.complete and not expected.problem_words:
    assert report.problems == []
  assert all(problem.startswith(f'{parser}: ') for problem in report.problems)


@pytest.mark.parametrize('parser, case', sorted(k for k, e in EXPECTED.items()
                                                if not e.statuses))
def test_a_run_without_tests_is_an_error_naming_the_parser_and_the_log_end(parser, case):
  log = _log(parser, case)
  report = testlogs.parse(parser, log)
  with pytest.raises(testlogs.NoTestsSeen, match=f"The '{parser}' log parser found no"):
    testlogs.require_tests(report, parser, log)


def test_no_tests_message_quotes_the_last_twenty_lines():
  log = ''.join(f'line {n}\n' for n in range(1, 31))
  empty = testlogs.TestReport({}, False, ['go: something broke'])
  with pytest.raises(testlogs.NoTestsSeen) as raised:
    testlogs.require_tests(empty, 'go', log)
  message = str(raised.value)
  assert 'go: something broke' in message
  assert 'line 11\n' in message and message.endswith('line 30')
  assert 'line 10\n' not in message
  some = testlogs.TestReport({'a': 'passed'}, True, [])
  assert testlogs.require_tests(some, 'go', log) is some


def test_unknown_parser_names_the_known_ones():
  with pytest.raises(ValueError, match=r"Unknown test log parser 'nose'.*'cargo', 'go'"):
    testlogs.parse('nose', 'PASSED t.py::test_a')


def test_a_repeated_id_keeps_its_worst_status():
  # A test passing then failing at teardown, in pytest -v's own lines.
  log = ('t.py::test_a PASSED    [ 50%]\nt.py::test_a ERROR     [ 50%]\n'
         't.py::test_b SKIPPED (later)  [100%]\n1 passed, 1 error in 0.01s\n')
  assert testlogs.parse('pytest', log).statuses == {'t.py::test_a': F, 't.py::test_b': S}
  builder = report_lib.ReportBuilder('test')
  for test_id, status in [('a', F), ('a', P), ('b', P), ('b', S), ('b', P), ('c', P)]:
    builder.add(test_id, status)
  assert builder.report().statuses == {'a': F, 'b': S, 'c': P}
  with pytest.raises(ValueError, match="status 'ok' of 'x' is not one of"):
    builder.add('x', 'ok')


def test_colours_and_carriage_returns_are_removed_before_parsing():
  log = ('\x1b[32mPASSED\x1b[0m t.py::test_a\r\n\x1b[31mFAILED\x1b[0m t.py::test_b - x\r\n'
         '\x1b[31m1 failed, 1 passed in 0.1s\x1b[0m\r\n')
  report = testlogs.parse('pytest', log)
  assert report.statuses == {'t.py::test_a': P, 't.py::test_b': F} and report.complete


def test_a_json_report_cut_in_the_middle_is_no_report():
  log = _log('jest', 'mixed')
  cut = log[:log.index('"testResults"') + 200]
  report = testlogs.parse('jest', cut)
  assert report.statuses == {} and not report.complete


def test_tape_plan_and_streams_are_checked():
  # An assertion line lost between the tests and the plan: the run is not whole.
  log = _log('tape', 'mixed').replace('ok 14 should be truthy\n', '')
  report = testlogs.parse('tape', log)
  assert not report.complete
  assert report.problems == ['tape: the plan announced 16 assertions, the log reports 15']
  # A stream that stopped without its plan, then another tape run: the first's running
  # test still fails.
  report = testlogs.parse('tape', _log('tape', 'timeout') + _log('tape', 'empty'))
  assert report.statuses == {'fast': P, 'hangs': F} and not report.complete
  # Nothing from tape at all.
  report = testlogs.parse('tape', '# looks like a test\nok 1 but no tape ran\n')
  assert report.statuses == {} and not report.complete
  assert 'no TAP output found' in report.problems[0]


def test_newer_go_build_failure_events():
  # The form go 1.24+ writes (cmd/test2json's build-output / build-fail / FailedBuild);
  # the fixtures' go 1.19 writes the older plain-text form.
  log = '\n'.join([
      '{"ImportPath":"m/calc [m/calc.test]","Action":"build-output","Output":"# m/calc '
      '[m/calc.test]\\n"}',
      '{"ImportPath":"m/calc [m/calc.test]","Action":"build-output","Output":"./calc.go:'
      '3:37: undefined: c\\n"}',
      '{"ImportPath":"m/calc [m/calc.test]","Action":"build-fail"}',
      '{"Action":"start","Package":"m/calc"}',
      '{"Action":"output","Package":"m/calc","Output":"FAIL\\tm/calc [build failed]\\n"}',
      '{"Action":"fail","Package":"m/calc","Elapsed":0,"FailedBuild":"m/calc '
      '[m/calc.test]"}'])
  report = testlogs.parse('go', log)
  assert report.statuses == {'m/calc': F} and not report.complete
  assert report.problems == ['go: package m/calc failed to build: ./calc.go:3:37: '
                             'undefined: c']


def test_cargo_quiet_output_is_noted():
  log = ('     Running unittests src/lib.rs (target/debug/deps/calc-c6626fb655a8d231)\n\n'
         'running 2 tests\n..\ntest result: ok. 2 passed; 0 failed; 0 ignored; 0 measured;'
         ' 0 filtered out; finished in 0.00s\n')
  report = testlogs.parse('cargo', log)
  assert report.statuses == {} and report.complete
  assert 'run cargo test without -q' in report.problems[0]


def test_paths_are_relative_to_the_sandbox_workdir():
  # The fixtures put their projects where a sandbox has the repository.
  assert make_testlogs.WORKDIR == sandbox_base.WORKDIR
  assert report_lib.workspace_relative(sandbox_base.WORKDIR + '/test/a.js') == 'test/a.js'
  assert report_lib.workspace_relative('/elsewhere/test/a.js') == '/elsewhere/test/a.js'


# --- grading through the parsers ---------------------------------------------------


class _ScriptedSandbox:
  """A sandbox whose test command prints a given log (the real parsers read it)."""

  def __init__(self, log: str, exit_code: int = 1, timed_out: bool = False):
    self.result = sandbox_base.ExecResult(exit_code, log.encode(), timed_out)
    self.commands = []

  def fork(self):
    return self

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False

  def write_file(self, path, content):
    pass

  def run_shell(self, command, timeout_s=None):
    self.commands.append(command)
    return self.result


def _task(parser, fail_to_pass, pass_to_pass=()):
  return tasks.Task(id='t', repo='.', prompt='p', test_command='run {tests}',
                    test_parser=parser, fail_to_pass=list(fail_to_pass),
                    pass_to_pass=list(pass_to_pass))


def test_grading_reads_the_tasks_parser():
  task = _task('go', ['example.com/calc/TestSubWrong', 'example.com/calc/TestGone'],
               ['example.com/calc/TestAdd', 'example.com/calc/TestSkipped'])
  passed, _ = reward.run_hidden_tests(_ScriptedSandbox(_log('go', 'mixed')), task)
  assert passed == {'example.com/calc/TestSubWrong': False,
                    'example.com/calc/TestGone': False,  # never named: not passed
                    'example.com/calc/TestAdd': True,
                    'example.com/calc/TestSkipped': False}
  task = _task('pytest', ['tests/test_mixed.py::test_equal[x y-x y]',
                          'tests/test_mixed.py::test_known_bug',
                          'tests/test_mixed.py::test_fixed_bug'])
  passed, _ = reward.run_hidden_tests(_ScriptedSandbox(_log('pytest', 'summary')), task)
  assert passed == {'tests/test_mixed.py::test_equal[x y-x y]': True,
                    'tests/test_mixed.py::test_known_bug': True,
                    'tests/test_mixed.py::test_fixed_bug': False}
  task = _task('tape', ['exits the process', 'after the exit'], ['before the exit'])
  passed, _ = reward.run_hidden_tests(_ScriptedSandbox(_log('tape', 'crash')), task)
  assert passed == {'exits the process': False, 'after the exit': False,
                    'before the exit': True}


def test_an_empty_run_is_an_infra_error_unless_the_run_broke_or_is_a_pytest_script():
  go_task = _task('go', ['example.com/calc/TestAdd'])
  with pytest.raises(testlogs.NoTestsSeen, match="'go' log parser"):
    reward.run_hidden_tests(_ScriptedSandbox(_log('go', 'empty'), exit_code=0), go_task)
  # The runner itself missing (command not found) is the environment's fault too.
  with pytest.raises(testlogs.NoTestsSeen, match="'jest' log parser"):
    reward.run_hidden_tests(_ScriptedSandbox('sh: 1: jest: not found\n', exit_code=127),
                            _task('jest', ['a.test.js > adds']))
  # A run the agent's code can have broken (a hang, process.exit() killing jest before its
  # JSON report) fails every listed test: breaking the runner must not dodge a 0.
  jest_task = _task('jest', ['a.test.js > adds'], ['a.test.js > subtracts'])
  for exit_code, timed_out, log in ((1, False, _log('jest', 'crash')),
                                    (124, True, _log('jest', 'timeout'))):
    passed, _ = reward.run_hidden_tests(_ScriptedSandbox(log, exit_code, timed_out), jest_task)
    assert passed == {'a.test.js > adds': False, 'a.test.js > subtracts': False}
  # A single script under the 'pytest' parser: its exit status decides.
  script = _task('pytest', ['hello'])
  assert reward.run_hidden_tests(_ScriptedSandbox('ok\n', 0), script)[0] == {'hello': True}
  assert reward.run_hidden_tests(_ScriptedSandbox('', 1), script)[0] == {'hello': False}
  assert reward.run_hidden_tests(_ScriptedSandbox('', 0, timed_out=True),
                                 script)[0] == {'hello': False}


def test_tasks_name_a_known_parser_and_keep_it_through_json(tmp_path):
  with pytest.raises(ValueError, match=r"test_parser 'nose'; known parsers: \['cargo'"):
    _task('nose', ['a'])
  path = str(tmp_path / 'tasks.jsonl')
  tasks.save_jsonl([_task('cargo', ['calc::tests::adds'])], path)
  (loaded,) = tasks.load_jsonl(path)
  assert loaded.test_parser == 'cargo'
  assert tasks.Task.from_json({'id': 'x', 'repo': '.', 'prompt': 'p',
                               'fail_to_pass': ['a']}).test_parser == 'pytest'
  (tmp_path / 'proj__1').mkdir()
  record = {'instance_id': 'proj__1', 'problem_statement': 'p', 'FAIL_TO_PASS': ['t'],
            'test_command': 'go test -json ./...', 'test_parser': 'go'}
  (tmp_path / 'swe.jsonl').write_text(json.dumps(record) + '\n')
  (task,) = tasks.load_swebench_jsonl(str(tmp_path / 'swe.jsonl'), str(tmp_path))
  assert (task.test_command, task.test_parser) == ('go test -json ./...', 'go')
