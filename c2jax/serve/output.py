"""Sampled token ids -> what an OpenAI client sees: content, tool calls, streamed deltas.

The final answer is computed once from all tokens (`Output.final`); streaming shows only
text that cannot change any more, so the concatenated deltas always equal the final
content:
  - a trailing stop token (<|end|>, <|eos|>) is not text;
  - text from the first stop string on is cut (the engine keeps the tokens: the capture
    is token-exact), and a suffix that could still grow into a stop string is held back;
  - with tools, tool-call blocks are not content: they become `tool_calls` parsed by the
    agent's own protocol parser (c2jax/agent/protocol.py), exactly as the harness reads
    a model turn; an unterminated block hides the rest of the text, and a suffix that
    could still grow into the block marker is held back;
  - with tools, content is stripped as the protocol strips it, so leading whitespace is
    dropped and trailing whitespace waits for more text;
  - an incomplete UTF-8 sequence at the end (U+FFFD from a partial byte token) waits.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

from c2jax.toolcalls import protocol


@dataclasses.dataclass
class Final:
  content: str
  tool_calls: list[dict]  # OpenAI tool_calls entries
  call_errors: list[str]  # malformed tool-call blocks, as the protocol describes them
  finish_reason: str  # "stop" | "length" | "tool_calls"


_FINISH = {"stop_token": "stop", "stop_string": "stop", "max_tokens": "length",
           "length": "length"}


def _held_suffix(text: str, patterns: Sequence[str]) -> int:
  """Length of the longest suffix of `text` that is a proper prefix of a pattern."""
  longest = 0
  for pattern in patterns:
    for n in range(min(len(pattern) - 1, len(text)), longest, -1):
      if text.endswith(pattern[:n]):
        longest = n
        break
  return longest


class Output:
  """Tracks one request's sampled tokens and what of them has been streamed."""

  def __init__(self, decode: Callable[[Sequence[int]], str], *, stop_ids: Sequence[int],
               stop_strings: Sequence[str], tools: bool, call_id_prefix: str):
    self._decode = decode
    self._stop_ids = set(int(t) for t in stop_ids)
    self._stop_strings = tuple(stop_strings)
    self._tools = tools
    self._call_id_prefix = call_id_prefix
    self.emitted = ""
    self._committed_tokens, self._committed_text = 0, ""

  def _incremental(self, tokens: list[int]) -> str:
    """decode(tokens) in O(new tokens) per call while streaming: text is committed up to
    a character boundary, and each call decodes the new tokens with a few committed ones
    before them as context (decoders that drop a leading space, or a token that splits a
    character, need it); if the context does not reproduce, decode everything."""
    done = self._committed_tokens
    if len(tokens) < done:
      done, self._committed_text = 0, ""
    start = max(0, done - 4)
    context = self._decode(tokens[start:done]) if done else ""
    tail = self._decode(tokens[start:])
    if not tail.startswith(context):
      return self._decode(tokens)
    new = tail[len(context):]
    if new.endswith("\ufffd"):
      return self._committed_text + new
    self._committed_tokens, self._committed_text = len(tokens), self._committed_text + new
    return self._committed_text

  def _text(self, tokens: Sequence[int], final: bool = False) -> tuple[str, bool]:
    """(decoded text cut at a stop string, whether a stop string was found)."""
    tokens = list(tokens)
    if tokens and tokens[-1] in self._stop_ids:
      tokens = tokens[:-1]
    text = self._decode(tokens) if final else self._incremental(tokens)
    cuts = [text.find(s) for s in self._stop_strings if s in text]
    if cuts:
      return text[:min(cuts)], True
    return text, False

  def _visible(self, text: str) -> str:
    if not self._tools:
      return text
    pieces, pos = [], 0
    while True:
      start = text.find(protocol.TOOL_CALL_START, pos)
      if start < 0:
        pieces.append(text[pos:])
        break
      pieces.append(text[pos:start])
      end = text.find(protocol.TOOL_CALL_END, start + len(protocol.TOOL_CALL_START))
      if end < 0:
        break
      pos = end + len(protocol.TOOL_CALL_END)
    return "".join(pieces).lstrip()

  def delta(self, tokens: Sequence[int]) -> str:
    """New content that is safe to stream after `tokens` (all sampled so far)."""
    text, stopped = self._text(tokens)
    if not stopped:
      text = text.rstrip("\ufffd")
      held = _held_suffix(text, self._stop_strings + (
          (protocol.TOOL_CALL_START,) if self._tools else ()))
      text = text[:len(text) - held]
    visible = self._visible(text)
    if self._tools:
      visible = visible.rstrip()
    if not visible.startswith(self.emitted):
      return ""
    new = visible[len(self.emitted):]
    self.emitted = visible
    return new

  def final(self, tokens: Sequence[int], engine_reason: str) -> tuple[Final, str]:
    """(the complete answer, the content not streamed yet)."""
    text, _ = self._text(tokens, final=True)
    calls, errors = [], []
    content = text
    if self._tools:
      turn = protocol.parse_turn(text)
      content = turn.content
      for call in turn.calls:
        if isinstance(call, protocol.ToolCall):
          calls.append({"id": f"{self._call_id_prefix}_{len(calls)}", "type": "function",
                        "function": {"name": call.name,
                                     "arguments": json.dumps(call.arguments)}})
        else:
          errors.append(call.message)
    rest = content[len(self.emitted):] if content.startswith(self.emitted) else ""
    self.emitted = content
    reason = _FINISH[engine_reason]
    if calls and reason == "stop":
      reason = "tool_calls"
    return Final(content, calls, errors, reason), rest
