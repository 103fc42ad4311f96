"""The text protocol for tool calls (in model turns) and tool results (observations).

A model turn is free text with any number of tool-call blocks, run in order:

    I'll look at the failing module first.
    <tool_call>{"name": "read_file", "arguments": {"path": "src/app.py"}}</tool_call>
    <tool_call>{"name": "grep", "arguments": {"pattern": "def parse"}}</tool_call>

Inside a block is one JSON object with a string `name` and an object `arguments`
(omitted means {}). JSON may escape '/' as '\\/', so a payload that must contain the
end marker writes it as '<\\/tool_call>'. Each call's result comes back as one block

    <tool_result name="read_file" status="ok">
         1\timport os
    </tool_result>

with status "ok" or "error" (name "invalid" when the call had no usable name). A chat
template renders an assistant message as `render_turn(content, calls)` and each tool
message as `render_result(...)`; `to_openai_messages` gives the same exchange as an
OpenAI-style message list (for SFT traces and OpenAI-compatible endpoints).

`parse_turn` never raises: a block that cannot be used (bad JSON, no name, arguments
not an object, unterminated, too large, invalid UTF-8) becomes a `CallError` that the
harness turns into an error observation telling the model what to fix.
"""

import dataclasses
import json
import re

TOOL_CALL_START = '<tool_call>'
TOOL_CALL_END = '</tool_call>'
TOOL_RESULT_START = '<tool_result'  # attributes follow, then '>'
TOOL_RESULT_END = '</tool_result>'
INVALID_NAME = 'invalid'
MAX_CALL_CHARS = 256 * 1024
MAX_CALLS_PER_TURN = 64
_NAME_RE = re.compile(r'[A-Za-z_][A-Za-z0-9_.-]{0,63}')
NAME_RE = _NAME_RE  # what a tool name may be (other tool-call formats check it too)


@dataclasses.dataclass(frozen=True)
class ToolCall:
  index: int  # position in the turn, counting malformed blocks too
  name: str
  arguments: dict


@dataclasses.dataclass(frozen=True)
class CallError:
  index: int
  message: str
  name: str = INVALID_NAME


@dataclasses.dataclass(frozen=True)
class Turn:
  content: str  # the turn's text with the tool-call blocks removed
  calls: list  # ToolCall | CallError, in order


def _decode(raw) -> tuple[str, str | None]:
  if isinstance(raw, str):
    return raw, None
  try:
    return bytes(raw).decode('utf-8'), None
  except UnicodeDecodeError as e:
    return bytes(raw).decode('utf-8', errors='replace'), (
        f'The turn was not valid UTF-8 (byte {e.start}); undecodable bytes were '
        'replaced with U+FFFD. Send plain UTF-8 text.')


decode_turn = _decode  # (str | bytes) -> (text, error message or None); formats.py reuses it


def _parse_block(index: int, body: str) -> ToolCall | CallError:
  if len(body) > MAX_CALL_CHARS:
    return CallError(index, f'Tool call {index} is {len(body)} characters, over the '
                     f'limit of {MAX_CALL_CHARS}; write large content in smaller pieces.')
  try:
    payload = json.loads(body)
  except (json.JSONDecodeError, RecursionError) as e:
    msg = getattr(e, 'msg', 'nested too deeply')
    return CallError(index, f'Tool call {index} is not valid JSON ({msg}); send '
                     '{"name": "<tool>", "arguments": {...}} between the markers.')
  if not isinstance(payload, dict):
    return CallError(index, f'Tool call {index} must be a JSON object with "name" and '
                     f'"arguments", not a {type(payload).__name__}.')
  name = payload.get('name')
  if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
    return CallError(index, f'Tool call {index} needs a string "name" naming a tool '
                     f'(got {str(name)[:80]!r}).')
  arguments = payload.get('arguments', {})
  if isinstance(arguments, str):  # OpenAI-style: arguments as a JSON string
    try:
      arguments = json.loads(arguments)
    except (json.JSONDecodeError, RecursionError):
      return CallError(index, f'Tool call {index} ({name}): "arguments" is a string '
                       'that is not valid JSON; send an object.', name)
  if not isinstance(arguments, dict):
    return CallError(index, f'Tool call {index} ({name}): "arguments" must be a JSON '
                     f'object, not a {type(arguments).__name__}.', name)
  extra = sorted(set(payload) - {'name', 'arguments'})
  if extra:
    return CallError(index, f'Tool call {index} ({name}) has unexpected keys {extra}; '
                     'put tool arguments inside "arguments".', name)
  return ToolCall(index, name, arguments)


def parse_turn(raw) -> Turn:
  """Splits a model turn (str or bytes) into its text and its tool calls. Never raises."""
  try:
    text, decode_error = _decode(raw)
  except Exception as e:  # pylint: disable=broad-except
    return Turn('', [CallError(0, f'The turn could not be read as text ({e}).')])
  calls, content, pos = [], [], 0
  if decode_error:
    calls.append(CallError(0, decode_error))
  while True:
    start = text.find(TOOL_CALL_START, pos)
    if start < 0:
      content.append(text[pos:])
      break
    content.append(text[pos:start])
    body_start = start + len(TOOL_CALL_START)
    end = text.find(TOOL_CALL_END, body_start)
    index = len(calls)
    if len(calls) >= MAX_CALLS_PER_TURN:
      calls.append(CallError(index, f'More than {MAX_CALLS_PER_TURN} tool calls in one '
                             'turn; the rest were ignored. Make fewer calls per turn.'))
      break
    if end < 0:
      calls.append(CallError(index, f'Tool call {index} has no closing {TOOL_CALL_END}; '
                             'end every call with it.'))
      break
    calls.append(_parse_block(index, text[body_start:end].strip()))
    pos = end + len(TOOL_CALL_END)
  return Turn(''.join(content).strip(), calls)


def render_call(name: str, arguments: dict) -> str:
  # Escaping '/' as '\/' keeps '</tool_call>' out of any string inside the payload.
  body = json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)
  return TOOL_CALL_START + body.replace('</', '<\\/') + TOOL_CALL_END


def render_turn(content: str, calls: list[tuple[str, dict]]) -> str:
  """Text of an assistant turn: its content, then one block per (name, arguments)."""
  blocks = [render_call(name, args) for name, args in calls]
  return '\n'.join(([content] if content else []) + blocks)


def render_result(name: str, ok: bool, output: str) -> str:
  name = name if _NAME_RE.fullmatch(name or '') else INVALID_NAME
  status = 'ok' if ok else 'error'
  return f'{TOOL_RESULT_START} name="{name}" status="{status}">\n{output}\n{TOOL_RESULT_END}'


def _describe(spec: dict) -> str:
  function = spec['function']
  schema = function['parameters']
  required = set(schema.get('required', ()))
  args = [name + ('' if name in required else '?') + ': ' + prop.get('type', 'any')
          for name, prop in schema.get('properties', {}).items()]
  return f"- {function['name']}({', '.join(args)}): {function['description']}"


def system_message(system_prompt: str, tool_specs: list[dict]) -> str:
  """The system prompt followed by a compact listing of the tools and the call format
  (the agent's system message, and what the server puts before an OpenAI request's tools)."""
  if not tool_specs:
    return system_prompt
  example = render_call('name', {'argument': 'value'})
  lines = [system_prompt, '', f'Call tools by writing {example} (several per turn allowed; '
           '? marks optional arguments). Tools:']
  return '\n'.join(lines + [_describe(spec) for spec in tool_specs])


def to_openai_messages(turn: Turn, observations, turn_number: int = 0) -> list[dict]:
  """An assistant message with its tool_calls, then one `tool` message per observation.

  observations: objects with index, name, ok, output (c2jax.env.tools.Observation).
  turn_number makes call ids unique across a conversation.
  """
  tool_calls = [{'id': f'call_{turn_number}_{c.index}', 'type': 'function',
                 'function': {'name': c.name, 'arguments': json.dumps(c.arguments)}}
                for c in turn.calls if isinstance(c, ToolCall)]
  message = {'role': 'assistant', 'content': turn.content}
  if tool_calls:
    message['tool_calls'] = tool_calls
  tool_messages = [{'role': 'tool', 'tool_call_id': f'call_{turn_number}_{o.index}',
                    'name': o.name,
                    'content': o.output if o.ok else f'ERROR: {o.output}'}
                   for o in observations]
  return [message] + tool_messages
