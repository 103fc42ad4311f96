"""Chat template: OpenAI-style messages <-> token ids with an assistant-only loss mask.

Layout (markers are single special tokens, see tokenizer.py):

  <|bos|> <|system|>...<|end|> <|user|>...<|end|>
  <|assistant|>text, then tool-call blocks<|end|> <|tool|><tool_result ...>...</tool_result><|end|>
  ... <|eos|>

An assistant message's body is the agent protocol's turn text (c2jax/agent/protocol.py:
`render_turn`), so the model learns exactly the tool-call format the harness parses; a
tool message's body is the protocol's `render_result`, with an OpenAI `content` that
starts with "ERROR: " meaning a failed call (the protocol's own OpenAI mapping). The loss
mask is 1 on the assistant's body and its closing <|end|> (what the policy emits) and 0 on
everything else, tool results included.

Messages are first brought to a canonical form, which is what `parse` gives back:
assistant text stripped (the protocol strips it), tool-call ids `call_{t}_{k}` for the
k-th call of the t-th assistant turn (as protocol.to_openai_messages numbers them),
`arguments` as `json.dumps` of the object, and every tool message carrying the
`tool_call_id` and `name` of the call it answers, in call order.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np

from c2jax.toolcalls import protocol
from c2jax.data import chat_template
from c2jax.data.model_tokenizer import ModelTokenizer
from c2jax.data.tokenizer import SPECIAL_TOKENS, Tokenizer

ROLES = ("system", "user", "assistant", "tool")
_ERROR_PREFIX = "ERROR: "
_RESULT_RE = re.compile(
    re.escape(protocol.TOOL_RESULT_START) + r' name="([^"]*)" status="(ok|error)">\n(.*)\n'
    + re.escape(protocol.TOOL_RESULT_END), re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Rendered:
  ids: np.ndarray  # int32 [T]
  loss_mask: np.ndarray  # int32 [T]; 1 on tokens the assistant produced


def _call_id(turn: int, index: int) -> str:
  # The ids protocol.to_openai_messages gives, numbering assistant turns from 0.
  return f"call_{turn}_{index}"


def _arguments(where: str, arguments) -> dict:
  if isinstance(arguments, str):
    try:
      arguments = json.loads(arguments)
    except json.JSONDecodeError as e:
      raise ValueError(f"{where}: arguments are not valid JSON ({e.msg}).") from e
  if not isinstance(arguments, dict):
    raise ValueError(f"{where}: arguments must be a JSON object, got "
                     f"{type(arguments).__name__}.")
  return arguments


def _canonical_assistant(where: str, message: dict,
                         turn_number: int) -> tuple[dict, list[tuple[str | None, str]]]:
  """The canonical message and its calls as (original id, name), which tool messages
  that follow must answer in order."""
  content = (message.get("content") or "").strip()
  calls = []
  for k, call in enumerate(message.get("tool_calls") or []):
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
      raise ValueError(f"{where}, tool call {k}: expected {{id, type: 'function', "
                       "function: {name, arguments}}.")
    calls.append((function["name"], _arguments(f"{where}, tool call {k}",
                                                function.get("arguments", "{}"))))
  turn = protocol.parse_turn(protocol.render_turn(content, calls))
  parsed = [(c.name, c.arguments) for c in turn.calls if isinstance(c, protocol.ToolCall)]
  if turn.content != content or parsed != calls:
    errors = [c.message for c in turn.calls if isinstance(c, protocol.CallError)]
    detail = "; ".join(errors) or f"its text contains {protocol.TOOL_CALL_START!r}"
    raise ValueError(f"{where}: cannot be written in the tool-call protocol and read back "
                     f"unchanged ({detail}); fix the trace.")
  result = {"role": "assistant", "content": content}
  if calls:
    result["tool_calls"] = [
        {"id": _call_id(turn_number, k), "type": "function",
         "function": {"name": name, "arguments": json.dumps(args)}}
        for k, (name, args) in enumerate(calls)]
  original_ids = [c.get("id") for c in message.get("tool_calls") or []]
  return result, [(call_id, name) for call_id, (name, _) in zip(original_ids, calls)]


def canonical(messages: list[dict]) -> list[dict]:
  """Validates messages and returns their canonical form (see the module docstring)."""
  result, pending, answered, turn_number = [], [], 0, -1
  for i, message in enumerate(messages):
    role = message.get("role") if isinstance(message, dict) else None
    where = f"message {i} ({role})"
    if role not in ROLES:
      raise ValueError(f"message {i}: role is {role!r}; expected one of {ROLES}.")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
      raise ValueError(f"{where}: content must be a string (got {type(content).__name__}); "
                       "join multi-part content into one string.")
    if role == "assistant":
      turn_number += 1
      canonical_message, pending = _canonical_assistant(where, message, turn_number)
      answered = 0
      result.append(canonical_message)
    elif role == "tool":
      if answered >= len(pending) or message.get("tool_call_id") != pending[answered][0]:
        expected = pending[answered][0] if answered < len(pending) else "none left"
        raise ValueError(f"{where}: tool_call_id {message.get('tool_call_id')!r} does not "
                         f"answer the next pending call of the last assistant message "
                         f"(expected {expected!r}); tool results must follow their calls "
                         "in order.")
      result.append({"role": "tool", "tool_call_id": _call_id(turn_number, answered),
                     "name": pending[answered][1], "content": content or ""})
      answered += 1
    else:
      result.append({"role": role, "content": content or ""})
  return result


def _pieces(message: dict) -> list[tuple[str, bool]]:
  """A canonical message's body as (text, is_marker) pieces, in order."""
  if message["role"] == "assistant":
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in message.get("tool_calls", [])]
    text = protocol.render_turn(message["content"], calls)
    pieces, pos = [], 0
    for name, arguments in calls:
      block = protocol.render_call(name, arguments)
      start = text.index(block, pos)
      inner = block[len(protocol.TOOL_CALL_START):-len(protocol.TOOL_CALL_END)]
      pieces += [(text[pos:start], False), (protocol.TOOL_CALL_START, True),
                 (inner, False), (protocol.TOOL_CALL_END, True)]
      pos = start + len(block)
    return pieces + [(text[pos:], False)]
  if message["role"] == "tool":
    content = message["content"]
    ok = not content.startswith(_ERROR_PREFIX)
    text = protocol.render_result(message["name"], ok,
                                  content if ok else content[len(_ERROR_PREFIX):])
    start, end = protocol.TOOL_RESULT_START, protocol.TOOL_RESULT_END
    return [(start, True), (text[len(start):-len(end)], False), (end, True)]
  return [(message["content"], False)]


def render(tokenizer: Tokenizer | ModelTokenizer, messages: list[dict], *,
           add_generation_prompt: bool = False,
           assistant_tokens: dict[int, np.ndarray] | None = None) -> Rendered:
  """Token ids and loss mask of a conversation; with `add_generation_prompt` it ends in
  the assistant marker (a prompt for the next turn) instead of <|eos|>.

  A released model's tokenizer renders with its own chat template instead (messages as
  given, mask from its {% generation %} blocks; see chat_template.py).

  assistant_tokens {message index: ids} puts the exact ids a policy sampled for that
  assistant message in place of its re-encoded text (the closing <|end|> is still
  added): text -> tokens is not unique, and a model continuing a conversation should see
  its own earlier turns exactly as it sampled them (token in, token out).
  """
  if isinstance(tokenizer, ModelTokenizer):
    if assistant_tokens:
      raise ValueError("render: assistant_tokens (exact sampled ids) works with c2jax's "
                       "own template only; a model template re-renders assistant text.")
    rendered = chat_template.apply(tokenizer, messages,
                                   add_generation_prompt=add_generation_prompt)
    return Rendered(rendered.ids, rendered.loss_mask)
  assistant_tokens = assistant_tokens or {}
  specials = tokenizer.specials
  ids, mask = [np.asarray([tokenizer.bos_id], np.int32)], [np.zeros(1, np.int32)]

  def add(piece_ids: np.ndarray, trained: bool) -> None:
    ids.append(piece_ids.astype(np.int32))
    mask.append(np.full(len(piece_ids), int(trained), np.int32))

  for index, message in enumerate(canonical(messages)):
    trained = message["role"] == "assistant"
    add(np.asarray([tokenizer.token_id(specials.role(message["role"]))]), False)
    if trained and index in assistant_tokens:
      add(np.asarray(assistant_tokens[index], np.int32), trained)
    else:
      for text, is_marker in _pieces(message):
        add(np.asarray([tokenizer.token_id(text)]) if is_marker else tokenizer.encode(text),
            trained)
    add(np.asarray([tokenizer.token_id(specials.end)]), trained)
  last = specials.assistant if add_generation_prompt else specials.eos
  add(np.asarray([tokenizer.token_id(last)]), False)
  return Rendered(np.concatenate(ids), np.concatenate(mask))


def parse(text: str) -> list[dict]:
  """Canonical messages from a rendered conversation's decoded text (inverse of render).

  Works on text, so message content that itself contains a role or end marker string
  cannot be told apart from structure; `render` never produces such ambiguity in ids.
  """
  s = SPECIAL_TOKENS
  body = text.removeprefix(s.bos).removesuffix(s.eos)
  role_of = {s.role(role): role for role in ROLES}
  pattern = re.compile("(" + "|".join(re.escape(m) for m in role_of) + ")(.*?)"
                       + re.escape(s.end), re.DOTALL)
  messages, pos, calls, answered, turn_number = [], 0, [], 0, -1
  while pos < len(body):
    match = pattern.match(body, pos)
    if match is None:
      raise ValueError(f"cannot parse conversation at character {pos}: expected a role "
                       f"marker, found {body[pos:pos + 40]!r}.")
    role, content = role_of[match.group(1)], match.group(2)
    pos = match.end()
    if role == "assistant":
      turn = protocol.parse_turn(content)
      errors = [c.message for c in turn.calls if isinstance(c, protocol.CallError)]
      if errors:
        raise ValueError(f"assistant message {len(messages)}: {errors[0]}")
      calls = [c.name for c in turn.calls]
      turn_number += 1
      message = {"role": "assistant", "content": turn.content}
      if calls:
        message["tool_calls"] = [
            {"id": _call_id(turn_number, k), "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for k, c in enumerate(turn.calls)]
      messages.append(message)
      answered = 0
    elif role == "tool":
      result = _RESULT_RE.fullmatch(content)
      if result is None or answered >= len(calls):
        raise ValueError(f"tool message {len(messages)} is not a tool result answering a "
                         f"pending call: {content[:80]!r}.")
      name, status, output = result.groups()
      messages.append({"role": "tool", "tool_call_id": _call_id(turn_number, answered),
                       "name": name,
                       "content": output if status == "ok" else _ERROR_PREFIX + output})
      answered += 1
    else:
      messages.append({"role": role, "content": content})
  return messages


def load_jsonl(path: str) -> list[list[dict]]:
  """Conversations from JSONL: each line `{"messages": [...]}` or a bare message list."""
  conversations = []
  with open(path, encoding="utf-8") as f:
    for line_number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        item = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{line_number}: not valid JSON ({e.msg}).") from e
      messages = item.get("messages") if isinstance(item, dict) else item
      if not isinstance(messages, list):
        raise ValueError(f"{path}:{line_number}: expected {{\"messages\": [...]}} or a list "
                         "of messages.")
      try:
        conversations.append(canonical(messages))
      except ValueError as e:
        raise ValueError(f"{path}:{line_number}: {e}") from e
  return conversations
