"""Tools over a real bubblewrap sandbox, their argument checks, and robustness."""

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from c2jax.toolcalls import protocol
from c2jax.env import bubblewrap, tools as tools_lib
from c2jax.env.tools import ToolsetConfig


def call(box, name, **arguments):
  return box.call(protocol.ToolCall(0, name, arguments))


@pytest.fixture
def tb(box):
  return tools_lib.Toolbox(box, ToolsetConfig(max_output_chars=2000))


def test_read_file_numbers_lines_and_pages(tb):
  obs = call(tb, 'read_file', path='pkg/mathx.py', offset=2, limit=2)
  assert obs.ok
  assert obs.output == ('     2\t    return a + b\n     3\t\n'
                        '[... 3 more lines; continue with offset=4]')
  assert 'past the end' in call(tb, 'read_file', path='pkg/mathx.py', offset=99).output


def test_edit_file_needs_an_exact_unique_match(tb, box):
  assert call(tb, 'edit_file', path='pkg/mathx.py', old_string='a * b',
              new_string='a * b * 1').ok
  assert b'a * b * 1' in box.read_file('pkg/mathx.py')
  missing = call(tb, 'edit_file', path='pkg/mathx.py', old_string='a / b', new_string='')
  assert not missing.ok and 'not found' in missing.output
  twice = call(tb, 'edit_file', path='pkg/mathx.py', old_string='return', new_string='r')
  assert not twice.ok and 'occurs 2 times' in twice.output
  created = call(tb, 'edit_file', path='new/mod.py', old_string='', new_string='x = 1\n')
  assert created.ok and box.read_file('new/mod.py') == b'x = 1\n'
  exists = call(tb, 'edit_file', path='new/mod.py', old_string='', new_string='y')
  assert not exists.ok and 'already exists' in exists.output


def test_write_list_glob_grep(tb):
  assert call(tb, 'write_file', path='docs/notes.md', content='TODO: add\n').ok
  assert call(tb, 'list_dir').output == 'README.md\ndocs/\npkg/'
  assert call(tb, 'list_dir', path='pkg').output == '__init__.py\nmathx.py\ntext.py'
  assert 'is a file' in call(tb, 'list_dir', path='README.md').output
  assert call(tb, 'glob', pattern='pkg/*.py').output.splitlines() == [
      'pkg/__init__.py', 'pkg/mathx.py', 'pkg/text.py']
  assert call(tb, 'grep', pattern=r'def \w+\(a').output == (
      'pkg/mathx.py:1: def add(a, b):\npkg/mathx.py:5: def mul(a, b):')
  assert call(tb, 'grep', pattern='todo', ignore_case=True, glob='*.md').output == (
      'docs/notes.md:1: TODO: add')
  assert call(tb, 'grep', pattern='def', path='pkg/text.py').output.startswith(
      'pkg/text.py:1:')
  bad = call(tb, 'grep', pattern='(')
  assert not bad.ok and 'Invalid regular expression' in bad.output


def test_run_shell_reports_status_and_truncates_head_and_tail(tb):
  obs = call(tb, 'run_shell', command='seq 1 5000; exit 4')
  assert obs.ok
  assert obs.output.startswith('exit code: 4\n1\n2\n')
  assert 'characters truncated' in obs.output and obs.output.rstrip().endswith('5000')
  assert len(obs.output) < 2200
  slow = call(tb, 'run_shell', command='sleep 30', timeout=1)
  assert 'timed out after 1s' in slow.output


def test_strict_and_lenient_argument_checks(box):
  strict = tools_lib.Toolbox(box, ToolsetConfig(strict=True))
  lenient = tools_lib.Toolbox(box, ToolsetConfig(strict=False))
  args = {'path': 'pkg/mathx.py', 'offset': '2', 'colour': 'red'}
  obs = call(strict, 'read_file', **args)
  assert not obs.ok and "unknown argument(s) ['colour']" in obs.output
  obs = call(strict, 'read_file', path='pkg/mathx.py', offset='2')
  assert not obs.ok and '"offset" must be a integer' in obs.output
  assert call(lenient, 'read_file', **args).output.startswith('     2\t')
  obs = call(strict, 'read_file')
  assert not obs.ok and 'missing the required argument "path"' in obs.output
  obs = call(strict, 'read_file', path='pkg/mathx.py', offset=0)
  assert 'must be >= 1' in obs.output
  obs = call(strict, 'read_file', path='pkg/mathx.py', offset=True)
  assert not obs.ok
  for timeout in (float('nan'), float('inf')):
    obs = call(lenient, 'run_shell', command='true', timeout=timeout)
    assert not obs.ok and '"timeout" must be a number' in obs.output


def test_tool_set_is_configurable(box):
  only = tools_lib.Toolbox(box, ToolsetConfig(tools=('read_file', 'finish')))
  assert [s['function']['name'] for s in only.specs()] == ['read_file', 'finish']
  obs = call(only, 'run_shell', command='ls')
  assert not obs.ok and 'available tools: read_file, finish' in obs.output
  with pytest.raises(ValueError, match=r"unknown tool\(s\) \['web_search'\]"):
    tools_lib.Toolbox(box, ToolsetConfig(tools=('web_search',)))


def test_paths_outside_the_workspace_are_errors(tb):
  for path in ('../../etc/passwd', '/etc/passwd', '/workspace/../etc'):
    obs = call(tb, 'read_file', path=path)
    assert not obs.ok and ('leaves the workspace' in obs.output or
                           'outside the workspace' in obs.output), obs


def test_binary_and_missing_files(tb, box):
  box.write_file('blob.bin', b'\x00\x01\x02')
  assert 'looks binary' in call(tb, 'read_file', path='blob.bin').output
  assert 'No such file' in call(tb, 'read_file', path='nope.py').output


def test_finish_stops_the_turn(tb):
  turn, obs = tb.run_turn('<tool_call>{"name": "finish", "arguments": {"message": "ok"}}'
                          '</tool_call><tool_call>{"name": "list_dir"}</tool_call>')
  assert tb.finished and tb.context.final_message == 'ok'
  assert [o.ok for o in obs] == [True, False]
  assert 'finish was already called' in obs[1].output
  assert obs[0].render() == '<tool_result name="finish" status="ok">\nFinished.\n</tool_result>'


@pytest.fixture(scope='module')
def fuzz_box(tmp_path_factory):
  root = tmp_path_factory.mktemp('fuzz')
  (root / 'a.py').write_text('x = 1\n')
  with bubblewrap.BubblewrapSandbox(str(root), timeout_s=5) as box:
    yield tools_lib.Toolbox(box, ToolsetConfig(
        tools=tuple(t for t in ToolsetConfig.tools if t != 'semantic_search'),
        shell_timeout_s=2))


_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(),
                    st.text(max_size=30), st.sampled_from(['a.py', '..', '/', '/etc',
                                                            '.', 'a.py/x', '\x00']),
                    st.lists(st.integers(), max_size=2))
_arg_names = st.sampled_from(['path', 'offset', 'limit', 'old_string', 'new_string',
                              'content', 'command', 'timeout', 'pattern', 'glob',
                              'ignore_case', 'query', 'top_k', 'message', 'bogus'])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(list(ToolsetConfig.tools) + ['nope', 'exec']),
       st.dictionaries(_arg_names, _values, max_size=4), st.booleans())
def test_toolbox_never_raises_on_random_calls(fuzz_box, name, arguments, as_text):
  if name == 'run_shell' and isinstance(arguments.get('command'), str):
    arguments['command'] = 'true'  # keep the fuzz from running arbitrary commands slowly
  fuzz_box.context.finished = False
  if as_text:
    text = '<tool_call>' + json.dumps({'name': name, 'arguments': arguments},
                                      default=str) + '</tool_call>'
    _, observations = fuzz_box.run_turn(text)
  else:
    observations = [fuzz_box.call(protocol.ToolCall(0, name, arguments))]
  assert len(observations) == 1
  assert isinstance(observations[0].output, str) and observations[0].output
  if name in ('nope', 'exec', 'semantic_search'):
    assert not observations[0].ok
