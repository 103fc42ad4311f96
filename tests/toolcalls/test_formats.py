"""Native tool-call formats (Qwen3, Kimi-K2): parsing what those models write, rendering
what their templates print, and robustness to any input (parsers never raise)."""

import json
import pathlib

import pytest
from hypothesis import given, settings, strategies as st

from c2jax.toolcalls import formats, protocol

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=3) |
    st.dictionaries(st.text(max_size=8), children, max_size=3), max_leaves=10)
_names = st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True)
_arguments = st.dictionaries(st.text(max_size=8), _json_values, max_size=4)
_KIMI_MARKERS = [formats.KIMI_SECTION_BEGIN, formats.KIMI_SECTION_END, formats.KIMI_CALL_BEGIN,
                 formats.KIMI_ARGUMENT_BEGIN, formats.KIMI_CALL_END]
FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "templates"


def test_registry():
  assert formats.format_names() == ("c2jax", "qwen3", "kimi_k2")
  with pytest.raises(ValueError, match="unknown tool-call format 'hermes'.*kimi_k2"):
    formats.get_format("hermes")


def test_qwen3_parses_what_its_template_prints():
  case = next(c for c in json.loads((FIXTURES / "cases.json").read_text())["cases"]
              if c["name"] == "qwen3/agent_tools")
  turn_text = case["text"].split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
  turn = formats.get_format("qwen3").parse_turn(turn_text)
  assert turn.calls == [protocol.ToolCall(0, "read_file", {"path": "src/app.py"}),
                        protocol.ToolCall(1, "grep", {"pattern": "def parse", "path": "src"})]
  assert turn.content.endswith("I'll look at the failing module first.")


def test_kimi_parses_what_its_template_prints():
  case = next(c for c in json.loads((FIXTURES / "cases.json").read_text())["cases"]
              if c["name"] == "kimi/agent_tools")
  turns = [t.split("<|im_end|>")[0]
           for t in case["text"].split("<|im_assistant|>assistant<|im_middle|>")[1:]]
  kimi = formats.get_format("kimi_k2")
  first, second, last = (kimi.parse_turn(t) for t in turns)
  assert first.content == "I'll look at the failing module first."
  assert first.calls == [protocol.ToolCall(0, "read_file", {"path": "src/app.py"}),
                         protocol.ToolCall(1, "grep", {"pattern": "def parse", "path": "src"})]
  assert second.content == "" and second.calls == [
      protocol.ToolCall(0, "read_file", {"path": "tests/test_app.py"})]
  assert last.calls == [] and last.content.startswith("<think>")
  assert kimi.call_id("grep", 0, 1, 1) == "functions.grep:1"


def test_kimi_malformed_calls_become_errors_that_say_what_is_wrong():
  s, e, b, a, c = _KIMI_MARKERS
  cases = {
      f"{s}{b}functions.grep:0{a}{{\"x\": {c}{e}": "not valid JSON",
      f"{s}{b}functions.grep:0{a}[1]{c}{e}": "must be a JSON object",
      f"{s}{b}functions.a b:0{a}{{}}{c}{e}": "naming a tool",
      f"{s}{b}functions.grep:0{{}}{c}{e}": f"has no {a}",
      f"{s}{b}functions.grep:0{a}{{}}{e}": f"no closing {c}",
      f"{s}{b}functions.grep:0{a}{{}}{c}": f"no closing {e}",
  }
  kimi = formats.get_format("kimi_k2")
  for text, message in cases.items():
    errors = [x for x in kimi.parse_turn(text).calls if isinstance(x, protocol.CallError)]
    assert errors and message in errors[0].message, (text, errors)
  many = s + f"{b}functions.finish:0{a}{{}}{c}" * (protocol.MAX_CALLS_PER_TURN + 3) + e
  calls = kimi.parse_turn(many).calls
  assert len(calls) == protocol.MAX_CALLS_PER_TURN + 1 and "More than" in calls[-1].message
  raw = b"\xff oops " + f"{s}{b}functions.finish:0{a}{{}}{c}{e}".encode()
  calls = kimi.parse_turn(raw).calls
  assert "not valid UTF-8" in calls[0].message and calls[1] == protocol.ToolCall(1, "finish", {})


def test_kimi_ids_without_prefix_or_index_and_empty_arguments():
  s, e, b, a, c = _KIMI_MARKERS
  turn = formats.get_format("kimi_k2").parse_turn(
      f"ok {s}{b} finish {a}{c}{b}grep:7{a} {{\"pattern\": \"x\"}} {c}{e} after")
  assert turn.calls == [protocol.ToolCall(0, "finish", {}),
                        protocol.ToolCall(1, "grep", {"pattern": "x"})]
  assert turn.content == "ok  after"


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(formats.format_names()),
       st.text() | st.binary() | st.lists(st.sampled_from(
           _KIMI_MARKERS + ["<tool_call>", "</tool_call>", "{", "}", '"', "functions.", ":0",
                            "x", "\n", '{"name": "a"}']), max_size=30).map("".join))
def test_parsers_never_raise(name, raw):
  turn = formats.get_format(name).parse_turn(raw)
  assert isinstance(turn.content, str)
  assert all(isinstance(c, (protocol.ToolCall, protocol.CallError)) for c in turn.calls)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(formats.format_names()), st.text(max_size=40),
       st.lists(st.tuples(_names, _arguments), max_size=4))
def test_render_then_parse_round_trips(name, content, calls):
  fmt = formats.get_format(name)
  markers = _KIMI_MARKERS + [protocol.TOOL_CALL_START]
  content = content.strip()
  if any(m in content for m in markers):
    return
  turn = fmt.parse_turn(fmt.render_turn(content, calls))
  assert turn.content == content
  assert [(c.name, c.arguments) for c in turn.calls] == calls
  assert all(isinstance(c, protocol.ToolCall) for c in turn.calls)


def test_kimi_numbers_calls_across_the_conversation():
  kimi = formats.get_format("kimi_k2")
  text = kimi.render_turn("", [("grep", {"pattern": "<|x"}), ("finish", {})], first_call=5)
  assert "functions.grep:5" in text and "functions.finish:6" in text
  assert kimi.parse_turn(text).calls[0].arguments == {"pattern": "<|x"}


def test_with_call_ids_follows_the_format_and_keeps_answers_linked():
  messages = [
      {"role": "user", "content": "x"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "a", "type": "function", "function": {"name": "grep", "arguments": "{}"}},
          {"id": "b", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "a", "content": "1"},
      {"role": "tool", "tool_call_id": "b", "content": "2"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "c", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c", "content": "3"}]
  kimi = formats.with_call_ids(messages, formats.get_format("kimi_k2"))
  assert [c["id"] for c in kimi[1]["tool_calls"]] == ["functions.grep:0", "functions.read:1"]
  assert [m["tool_call_id"] for m in kimi if m["role"] == "tool"] == [
      "functions.grep:0", "functions.read:1", "functions.grep:2"]
  c2jax = formats.with_call_ids(messages, formats.get_format("c2jax"))
  assert [m["tool_call_id"] for m in c2jax if m["role"] == "tool"] == [
      "call_0_0", "call_0_1", "call_1_0"]
  assert messages[2]["tool_call_id"] == "a"  # the input is not modified
