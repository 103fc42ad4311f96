"""Tool-call formats: how a model writes tool calls in its turn, chosen per model by config.

    fmt = get_format(config.agent.tool_format)     # 'c2jax' | 'qwen3' | 'kimi_k2'
    turn = fmt.parse_turn(text)                    # protocol.Turn; never raises
    text = fmt.render_turn(content, [(name, arguments), ...])

'c2jax' is c2jax's own text protocol (protocol.py), which models trained from scratch here
learn. A released model was trained on its own format, so an agent running it must parse
what it writes:

  qwen3    <tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>, one block per call
  kimi_k2  <|tool_calls_section_begin|>
             <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>
             ...
           <|tool_calls_section_end|>

Every parser turns a block it cannot use into a `protocol.CallError` whose message tells the
model what to fix, exactly like the c2jax protocol, so the harness never crashes on model
output. `call_id` gives the id a model's template expects on the tool message that answers a
call (Kimi's templates print it back as "## Return of functions.NAME:IDX").
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable

from c2jax.toolcalls import protocol

KIMI_SECTION_BEGIN = "<|tool_calls_section_begin|>"
KIMI_SECTION_END = "<|tool_calls_section_end|>"
KIMI_CALL_BEGIN = "<|tool_call_begin|>"
KIMI_ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
KIMI_CALL_END = "<|tool_call_end|>"
_KIMI_ID_RE = re.compile(r"\s*(?:functions\.)?(.+?)(?::(\d+))?\s*")


@dataclasses.dataclass(frozen=True)
class ToolCallFormat:
  name: str
  parse_turn: Callable[[object], protocol.Turn]  # never raises
  # (content, [(name, arguments)], first_call=calls earlier in the conversation) -> text
  render_turn: Callable[..., str]
  # (name, turn number, index in the turn, calls before it in the conversation) -> id
  call_id: Callable[[str, int, int, int], str]
  call_markers: tuple[str, str]  # the strings that open and close a call, for token spans


def _c2jax_call_id(name: str, turn: int, index: int, counter: int) -> str:
  del name, counter
  return f"call_{turn}_{index}"  # as protocol.to_openai_messages numbers them


# ---- Qwen3 ----------------------------------------------------------------------------------

def _c2jax_render(content: str, calls: list[tuple[str, dict]], first_call: int = 0) -> str:
  del first_call
  return protocol.render_turn(content, calls)


def _qwen3_render(content: str, calls: list[tuple[str, dict]], first_call: int = 0) -> str:
  del first_call
  blocks = []
  for name, arguments in calls:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    body = body.replace("</", "<\\/")  # keeps </tool_call> out of any string, as protocol
    blocks.append(f"{protocol.TOOL_CALL_START}\n{body}\n{protocol.TOOL_CALL_END}")
  return "\n".join(([content] if content else []) + blocks)


# ---- Kimi-K2 --------------------------------------------------------------------------------

def _kimi_arguments(index: int, name: str, body: str) -> protocol.ToolCall | protocol.CallError:
  if len(body) > protocol.MAX_CALL_CHARS:
    return protocol.CallError(index, f"Tool call {index} ({name}) is {len(body)} characters, "
                              f"over the limit of {protocol.MAX_CALL_CHARS}; write large "
                              "content in smaller pieces.", name)
  try:
    arguments = json.loads(body) if body.strip() else {}
  except (json.JSONDecodeError, RecursionError) as e:
    msg = getattr(e, "msg", "nested too deeply")
    return protocol.CallError(index, f"Tool call {index} ({name}): the arguments are not "
                              f"valid JSON ({msg}); write one JSON object after "
                              f"{KIMI_ARGUMENT_BEGIN}.", name)
  if not isinstance(arguments, dict):
    return protocol.CallError(index, f"Tool call {index} ({name}): the arguments must be a "
                              f"JSON object, not a {type(arguments).__name__}.", name)
  return protocol.ToolCall(index, name, arguments)


def _kimi_call(index: int, block: str) -> protocol.ToolCall | protocol.CallError:
  """One `ID<|tool_call_argument_begin|>JSON` block (between call begin and end)."""
  head, sep, body = block.partition(KIMI_ARGUMENT_BEGIN)
  match = _KIMI_ID_RE.fullmatch(head)
  name = match.group(1) if match else ""
  if not sep:
    return protocol.CallError(index, f"Tool call {index} has no {KIMI_ARGUMENT_BEGIN}; write "
                              f"{KIMI_CALL_BEGIN}functions.NAME:IDX{KIMI_ARGUMENT_BEGIN}"
                              f"{{...}}{KIMI_CALL_END}.")
  if not protocol.NAME_RE.fullmatch(name):
    return protocol.CallError(index, f"Tool call {index} needs an id functions.NAME:IDX naming "
                              f"a tool (got {head[:80]!r}).")
  return _kimi_arguments(index, name, body)


def _kimi_parse(raw) -> protocol.Turn:
  try:
    text, decode_error = protocol.decode_turn(raw)
  except Exception as e:  # pylint: disable=broad-except
    return protocol.Turn("", [protocol.CallError(0, f"The turn could not be read as text ({e}).")])
  calls, content, pos = [], [], 0
  if decode_error:
    calls.append(protocol.CallError(0, decode_error))
  while pos <= len(text):
    start = text.find(KIMI_SECTION_BEGIN, pos)
    if start < 0:
      content.append(text[pos:])
      break
    content.append(text[pos:start])
    end = text.find(KIMI_SECTION_END, start)
    section = text[start + len(KIMI_SECTION_BEGIN):end if end >= 0 else len(text)]
    pieces = section.split(KIMI_CALL_BEGIN)
    if pieces[0].strip():
      content.append(pieces[0])
    for piece in pieces[1:]:
      index = len(calls)
      if index >= protocol.MAX_CALLS_PER_TURN:
        calls.append(protocol.CallError(index, f"More than {protocol.MAX_CALLS_PER_TURN} tool "
                                        "calls in one turn; the rest were ignored. Make "
                                        "fewer calls per turn."))
        break
      block, closed, rest = piece.partition(KIMI_CALL_END)
      if not closed:
        calls.append(protocol.CallError(index, f"Tool call {index} has no closing "
                                        f"{KIMI_CALL_END}; end every call with it."))
        continue
      calls.append(_kimi_call(index, block))
      if rest.strip():
        content.append(rest)
    if len(calls) > protocol.MAX_CALLS_PER_TURN:
      break
    if end < 0:
      calls.append(protocol.CallError(len(calls), f"The tool-call section has no closing "
                                      f"{KIMI_SECTION_END}; close the section after the "
                                      "last call."))
      break
    pos = end + len(KIMI_SECTION_END)
  return protocol.Turn("".join(content).strip(), calls)


def _kimi_call_id(name: str, turn: int, index: int, counter: int) -> str:
  del turn, index
  return f"functions.{name}:{counter}"  # Kimi numbers calls across the conversation


def _kimi_render(content: str, calls: list[tuple[str, dict]], first_call: int = 0) -> str:
  if not calls:
    return content
  # '<|' can only occur inside JSON strings; written with the JSON escape for '|', no
  # marker can appear in the arguments, and json.loads gives the same string back.
  blocks = [f"{KIMI_CALL_BEGIN}functions.{name}:{first_call + k}{KIMI_ARGUMENT_BEGIN}"
            + json.dumps(arguments, ensure_ascii=False).replace("<|", "<\\u007c")
            + KIMI_CALL_END for k, (name, arguments) in enumerate(calls)]
  return content + KIMI_SECTION_BEGIN + "".join(blocks) + KIMI_SECTION_END


_FORMATS = {
    "c2jax": ToolCallFormat("c2jax", protocol.parse_turn, _c2jax_render,
                            _c2jax_call_id, (protocol.TOOL_CALL_START, protocol.TOOL_CALL_END)),
    "qwen3": ToolCallFormat("qwen3", protocol.parse_turn, _qwen3_render, _c2jax_call_id,
                            (protocol.TOOL_CALL_START, protocol.TOOL_CALL_END)),
    "kimi_k2": ToolCallFormat("kimi_k2", _kimi_parse, _kimi_render, _kimi_call_id,
                              (KIMI_CALL_BEGIN, KIMI_CALL_END)),
}


def with_call_ids(messages: list[dict], fmt: ToolCallFormat) -> list[dict]:
  """A copy of OpenAI-style messages whose tool-call ids (and the tool messages answering
  them) follow the format's convention, e.g. Kimi's functions.NAME:IDX, which its template
  prints and its model learns to write; other messages are unchanged."""
  result, renamed, turn, counter = [], {}, 0, 0
  for message in messages:
    if message.get("role") == "assistant" and message.get("tool_calls"):
      calls = []
      for k, call in enumerate(message["tool_calls"]):
        name = (call.get("function") or {}).get("name", "")
        new_id = fmt.call_id(name, turn, k, counter)
        counter += 1
        if call.get("id") is not None:
          renamed[call["id"]] = new_id
        calls.append({**call, "id": new_id})
      message = {**message, "tool_calls": calls}
    elif message.get("role") == "tool" and message.get("tool_call_id") in renamed:
      message = {**message, "tool_call_id": renamed[message["tool_call_id"]]}
    if message.get("role") == "assistant":
      turn += 1
    result.append(message)
  return result


def format_names() -> tuple[str, ...]:
  return tuple(_FORMATS)


def get_format(name: str) -> ToolCallFormat:
  if name not in _FORMATS:
    raise ValueError(f"unknown tool-call format {name!r}; choose one of {format_names()}.")
  return _FORMATS[name]
