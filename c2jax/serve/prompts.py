"""OpenAI request -> prompt token ids, laid out as the agent and the SFT data lay them out.

Chat: messages are rendered by the model's chat template (c2jax/data/chat.py), ending in
the assistant marker. Tools are listed in the system message exactly as the agent lists
its own (c2jax/toolcalls/protocol.py: system_message), so a model trained on agent traces
sees an external harness's tools the way it saw its own; assistant messages with tool_calls
and `tool` messages render as the agent's turns and observations. An assistant message
this server itself produced recently is rendered from the exact tokens it sampled
(TurnMemory), so a multi-turn conversation through the API keeps the policy's own tokens
as an in-process agent's live sequence does.

Clients that speak the text tool protocol (c2jax's <tool_call> blocks in the assistant's
content, results sent back as a user message of <tool_result> blocks, e.g. `c2jax eval`
with policy.tool_calls=text) get the same layout: such a turn is read as an assistant
message with tool_calls and the results as the `tool` messages answering them
(`from_text_protocol`), so the prompt's tokens are those of the in-process agent.

Completions: a string prompt is <|bos|> + its encoding; a token-id prompt is used as is.
"""

from __future__ import annotations

import collections
import json
import re
import threading

import numpy as np

from c2jax.toolcalls import protocol
from c2jax.data import chat
from c2jax.data.tokenizer import Tokenizer
from c2jax.serve import schema


def tool_specs(request: schema.ChatRequest) -> list[dict]:
  if request.tool_choice not in (None, "auto", "none"):
    raise schema.APIError(400, f"tool_choice = {request.tool_choice!r}: this server "
                          "supports 'auto' and 'none' (the model decides when to call "
                          "tools).", "tool_choice")
  if not request.tools or request.tool_choice == "none":
    return []
  return [{"type": "function", "function": {"name": t.function.name,
                                            "description": t.function.description,
                                            "parameters": t.function.parameters}}
          for t in request.tools]


_RESULT_RE = re.compile(re.escape(protocol.TOOL_RESULT_START) +
                        r' name="([^"]*)" status="(ok|error)">\n(.*?)\n' +
                        re.escape(protocol.TOOL_RESULT_END), re.DOTALL)


def _text_calls(content: str) -> list[dict] | None:
  """The calls of a text-protocol turn, or None when it has none or any is malformed (the
  template then refuses the message with its own error)."""
  if protocol.TOOL_CALL_START not in content:
    return None
  turn = protocol.parse_turn(content)
  if not turn.calls or not all(isinstance(c, protocol.ToolCall) for c in turn.calls):
    return None
  return [{"name": c.name, "arguments": c.arguments, "content": turn.content}
          for c in turn.calls]


def _text_results(content: str) -> list[tuple[str, bool, str]] | None:
  """(name, ok, output) of a user message made only of newline-joined <tool_result>
  blocks (c2jax.env.tools.Observation.render), or None."""
  results, pos = [], 0
  while pos < len(content):
    match = _RESULT_RE.match(content, pos)
    if match is None:
      return None
    results.append((match.group(1), match.group(2) == "ok", match.group(3)))
    pos = match.end()
    if pos < len(content):
      if content[pos] != "\n":
        return None
      pos += 1
  return results or None


def from_text_protocol(messages: list[dict]) -> list[dict]:
  """Text-protocol turns as assistant tool_calls + tool messages (module docstring). A
  user message of results converts only when it answers the preceding turn's calls one
  for one, by name; anything else is left as sent."""
  out, pending = [], []
  for i, message in enumerate(messages):
    role, content = message["role"], message.get("content") or ""
    if role == "assistant" and not message.get("tool_calls"):
      calls = _text_calls(content)
      if calls:
        message = dict(message, content=calls[0]["content"], tool_calls=[
            {"id": f"call_text_{i}_{k}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
            for k, c in enumerate(calls)])
      pending = message.get("tool_calls") or []
    elif role == "user" and pending:
      results = _text_results(content)
      if results and [name for name, _, _ in results] == [
          c["function"]["name"] for c in pending]:
        out += [{"role": "tool", "tool_call_id": call["id"],
                 "content": output if ok else f"ERROR: {output}"}
                for call, (_, ok, output) in zip(pending, results)]
        pending = []
        continue
      pending = []
    elif role != "tool":
      pending = []
    out.append(message)
  return out


def chat_messages(request: schema.ChatRequest, specs: list[dict]) -> list[dict]:
  """Plain message dicts, with the tool listing added to (or as) the system message.
  Each assistant message keeps the key of its text as sent under "_key" (TurnMemory);
  chat_prompt takes it out before rendering."""
  messages = []
  for i, message in enumerate(request.messages):
    # Newer OpenAI clients send system instructions as role "developer".
    role = "system" if message.role == "developer" else message.role
    item = {"role": role, "content": message.text(i)}
    if message.tool_calls:
      item["tool_calls"] = [{"id": c.id, "type": "function",
                             "function": {"name": c.function.name,
                                          "arguments": c.function.arguments}}
                            for c in message.tool_calls]
    if message.tool_call_id is not None:
      item["tool_call_id"] = message.tool_call_id
    if role == "assistant":
      item["_key"] = turn_key(item["content"], item.get("tool_calls"))
    messages.append(item)
  messages = from_text_protocol(messages)
  if specs:
    if messages[0]["role"] == "system":
      messages[0]["content"] = protocol.system_message(messages[0]["content"] or "", specs)
    else:
      messages.insert(0, {"role": "system", "content": protocol.system_message("", specs)})
  return messages


def turn_key(content: str | None, tool_calls: list[dict] | None) -> str | None:
  """What identifies an assistant message across a round trip through a client: its
  stripped content and its calls' names and parsed arguments (ids and JSON spacing are
  the client's business). None when an arguments string is not JSON."""
  calls = []
  for call in tool_calls or []:
    arguments = call["function"].get("arguments", "{}")
    if isinstance(arguments, str):
      try:
        arguments = json.loads(arguments)
      except json.JSONDecodeError:
        return None
    calls.append([call["function"]["name"], arguments])
  return json.dumps([(content or "").strip(), calls], sort_keys=True)


class TurnMemory:
  """The exact tokens of recent assistant replies, so a client sending a reply back as
  history gets it rendered as sampled, not re-encoded from text (an LRU of `size`)."""

  def __init__(self, size: int = 4096):
    self.size = size
    self._turns: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
    # Prompts render on worker threads while replies are remembered on the event loop.
    self._lock = threading.Lock()

  def remember(self, key: str | None, tokens: np.ndarray) -> None:
    if key is None:
      return
    with self._lock:
      self._turns[key] = np.asarray(tokens, np.int32)
      self._turns.move_to_end(key)
      while len(self._turns) > self.size:
        self._turns.popitem(last=False)

  def recall(self, key: str | None) -> np.ndarray | None:
    with self._lock:
      if key is None or key not in self._turns:
        return None
      self._turns.move_to_end(key)
      return self._turns[key]


def chat_prompt(tokenizer: Tokenizer, request: schema.ChatRequest, specs: list[dict],
                memory: TurnMemory | None = None) -> np.ndarray:
  messages = chat_messages(request, specs)
  exact = {}
  for index, message in enumerate(messages):
    key = message.pop("_key", None)
    if memory is not None and message["role"] == "assistant":
      tokens = memory.recall(key)
      if tokens is not None:
        exact[index] = tokens
  try:
    return chat.render(tokenizer, messages, add_generation_prompt=True,
                       assistant_tokens=exact).ids
  except ValueError as e:
    raise schema.APIError(400, f"messages: {e}", "messages") from e


def completion_prompts(tokenizer: Tokenizer, vocab_size: int,
                       request: schema.CompletionRequest) -> list[tuple[np.ndarray, int]]:
  """Per prompt of the request (a string, token ids, or a list of either): (prompt ids,
  where the client's own prompt starts in them: 1 after an added BOS)."""
  prompt = request.prompt
  if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
    return [_one_prompt(tokenizer, vocab_size, p, f"prompt.{i}")
            for i, p in enumerate(prompt)]
  return [_one_prompt(tokenizer, vocab_size, prompt, "prompt")]


def _one_prompt(tokenizer: Tokenizer, vocab_size: int, prompt: str | list[int],
                param: str) -> tuple[np.ndarray, int]:
  if isinstance(prompt, str):
    return np.concatenate([[tokenizer.bos_id], tokenizer.encode(prompt)]).astype(np.int32), 1
  if not prompt:
    raise schema.APIError(400, f"{param} is empty; send text or at least one token id.",
                          param)
  bad = [t for t in prompt if not 0 <= t < vocab_size]
  if bad:
    raise schema.APIError(400, f"{param} token id {bad[0]} is outside the model's "
                          f"vocabulary [0, {vocab_size}).", param)
  return np.asarray(prompt, np.int32), 0
