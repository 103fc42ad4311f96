"""The tool-call text protocol: rendering, parsing, and robustness to any input."""

import json

from hypothesis import given, settings, strategies as st

from c2jax.toolcalls import protocol

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=3) |
    st.dictionaries(st.text(max_size=8), children, max_size=3), max_leaves=10)
_names = st.from_regex(r'[a-z_][a-z0-9_]{0,20}', fullmatch=True)


def test_several_calls_with_text_around_them():
  text = ('Looking around first.\n'
          '<tool_call>{"name": "list_dir", "arguments": {}}</tool_call>\n'
          'and then\n<tool_call> {"name": "read_file", "arguments": {"path": "a.py"}} '
          '</tool_call>')
  turn = protocol.parse_turn(text)
  assert turn.content == 'Looking around first.\n\nand then'
  assert turn.calls == [protocol.ToolCall(0, 'list_dir', {}),
                        protocol.ToolCall(1, 'read_file', {'path': 'a.py'})]


def test_missing_arguments_mean_empty_and_string_arguments_are_decoded():
  turn = protocol.parse_turn('<tool_call>{"name": "finish"}</tool_call>'
                             '<tool_call>{"name": "grep", "arguments": "{\\"pattern\\": '
                             '\\"x\\"}"}</tool_call>')
  assert turn.calls == [protocol.ToolCall(0, 'finish', {}),
                        protocol.ToolCall(1, 'grep', {'pattern': 'x'})]


def test_malformed_calls_become_errors_that_say_what_is_wrong():
  cases = {
      '<tool_call>{"name": "x", </tool_call>': 'not valid JSON',
      '<tool_call>[1, 2]</tool_call>': 'must be a JSON object',
      '<tool_call>{"arguments": {}}</tool_call>': 'needs a string "name"',
      '<tool_call>{"name": "a b"}</tool_call>': 'needs a string "name"',
      '<tool_call>{"name": "x", "arguments": [1]}</tool_call>': '"arguments" must be',
      '<tool_call>{"name": "x", "arguments": "nope"}</tool_call>': 'not valid JSON',
      '<tool_call>{"name": "x", "path": "a"}</tool_call>': 'unexpected keys [\'path\']',
      '<tool_call>{"name": "x"}': 'no closing </tool_call>',
      '<tool_call>' + '[' * 100000 + '</tool_call>': 'not valid JSON',
  }
  for text, message in cases.items():
    (call,) = protocol.parse_turn(text).calls
    assert isinstance(call, protocol.CallError), text
    assert message in call.message, (text, call.message)


def test_huge_payloads_and_too_many_calls_are_refused():
  huge = '<tool_call>{"name": "write_file", "arguments": {"content": "%s"}}</tool_call>' % (
      'x' * (protocol.MAX_CALL_CHARS + 1))
  (call,) = protocol.parse_turn(huge).calls
  assert 'over the limit' in call.message
  many = '<tool_call>{"name": "finish"}</tool_call>' * (protocol.MAX_CALLS_PER_TURN + 5)
  calls = protocol.parse_turn(many).calls
  assert len(calls) == protocol.MAX_CALLS_PER_TURN + 1
  assert 'More than' in calls[-1].message


def test_invalid_utf8_is_reported_and_the_rest_still_parsed():
  raw = b'\xff\xfe oops <tool_call>{"name": "finish"}</tool_call>'
  calls = protocol.parse_turn(raw).calls
  assert 'not valid UTF-8' in calls[0].message
  assert calls[1] == protocol.ToolCall(1, 'finish', {})


def test_end_marker_inside_an_argument_survives_rendering():
  args = {'content': 'print("</tool_call>")', 'path': 'a/b.py'}
  text = protocol.render_turn('hi', [('write_file', args)])
  assert protocol.parse_turn(text).calls == [protocol.ToolCall(0, 'write_file', args)]


def test_results_and_openai_messages():
  assert protocol.render_result('grep', False, 'bad regex') == (
      '<tool_result name="grep" status="error">\nbad regex\n</tool_result>')
  assert protocol.render_result('a b"><x', True, '') .startswith(
      '<tool_result name="invalid"')

  class Obs:
    index, name, ok, output = 0, 'grep', True, 'hit'
  turn = protocol.parse_turn('go <tool_call>{"name": "grep", "arguments": '
                             '{"pattern": "q"}}</tool_call>')
  messages = protocol.to_openai_messages(turn, [Obs()], turn_number=3)
  assert messages == [
      {'role': 'assistant', 'content': 'go', 'tool_calls': [{
          'id': 'call_3_0', 'type': 'function',
          'function': {'name': 'grep', 'arguments': '{"pattern": "q"}'}}]},
      {'role': 'tool', 'tool_call_id': 'call_3_0', 'name': 'grep', 'content': 'hit'}]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_names, st.dictionaries(st.text(max_size=10), _json_values,
                                                  max_size=4)), max_size=5),
       st.text().filter(lambda t: protocol.TOOL_CALL_START not in t))
def test_render_then_parse_round_trips(calls, content):
  turn = protocol.parse_turn(protocol.render_turn(content, calls))
  assert [(c.name, c.arguments) for c in turn.calls] == calls
  assert turn.content == content.strip()


_fragments = st.sampled_from([protocol.TOOL_CALL_START, protocol.TOOL_CALL_END, '{', '}',
                              '"name"', ':', '"arguments"', '"read_file"', '[', ']',
                              ',', '\\', '"', 'null', '1e999', '\x00', '\ud7ff'])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300),
                 st.lists(st.one_of(_fragments, st.text(max_size=5)),
                          max_size=40).map(''.join)))
def test_parser_never_raises_on_any_input(raw):
  turn = protocol.parse_turn(raw)
  assert isinstance(turn.content, str)
  for i, call in enumerate(turn.calls):
    assert call.index == i
    if isinstance(call, protocol.ToolCall):
      assert isinstance(call.arguments, dict)
      json.dumps(call.arguments)
    else:
      assert call.message
