"""What the agent sees, as token ids laid out exactly as the chat template renders them.

The agent loop never renders a whole conversation: it appends pieces to a live engine
sequence. These functions produce those pieces so that a finished segment's tokens equal
`c2jax.data.chat.render` of the same messages (checked in tests/agent/test_agent_loop.py),
which is the layout the SFT phase trained on:

  prompt        <|bos|> <|system|>{system + tools}<|end|> <|user|>{task}<|end|> <|assistant|>
  model turn    {turn text, tool-call markers as single tokens}<|end|>      (sampled)
  observations  (<|tool|><tool_result{...}</tool_result><|end|>)* <|assistant|>
  summary ask   <|user|>{summary prompt}<|end|> <|assistant|>
  compaction    <|bos|> <|system|>{compaction prompt}<|end|> <|user|>{history}<|end|> <|assistant|>
                (a separate sequence; history_text renders the conversation as plain text)
"""

from __future__ import annotations

import numpy as np

from c2jax.toolcalls import protocol
from c2jax.data.tokenizer import Tokenizer
# The system prompt + tool listing is part of the call protocol (the server writes it too);
# the agent's prompt pieces start from it.
from c2jax.toolcalls.protocol import system_message  # pylint: disable=unused-import


def initial_messages(system: str, task_prompt: str) -> list[dict]:
  return [{"role": "system", "content": system}, {"role": "user", "content": task_prompt}]


def _marker(tokenizer: Tokenizer, token: str) -> np.ndarray:
  return np.asarray([tokenizer.token_id(token)], np.int32)


def message_ids(tokenizer: Tokenizer, role: str, content: str) -> np.ndarray:
  """<|role|>{content}<|end|> for a system or user message."""
  specials = tokenizer.specials
  return np.concatenate([_marker(tokenizer, specials.role(role)), tokenizer.encode(content),
                         _marker(tokenizer, specials.end)]).astype(np.int32)


def prompt_ids(tokenizer: Tokenizer, system: str, task_prompt: str,
               extra_user: np.ndarray | None = None) -> np.ndarray:
  """The first segment's prompt; `extra_user` (token ids) adds a second user message,
  e.g. a self-summary, before the generation prompt."""
  pieces = [_marker(tokenizer, tokenizer.specials.bos),
            message_ids(tokenizer, "system", system),
            message_ids(tokenizer, "user", task_prompt)]
  if extra_user is not None:
    specials = tokenizer.specials
    pieces += [_marker(tokenizer, specials.user), np.asarray(extra_user, np.int32),
               _marker(tokenizer, specials.end)]
  pieces.append(_marker(tokenizer, tokenizer.specials.assistant))
  return np.concatenate(pieces).astype(np.int32)


def observation_ids(tokenizer: Tokenizer, observations) -> np.ndarray:
  """Tool messages for a turn's observations, then the next turn's <|assistant|>."""
  specials = tokenizer.specials
  start, end = protocol.TOOL_RESULT_START, protocol.TOOL_RESULT_END
  pieces = []
  for observation in observations:
    text = protocol.render_result(observation.name, observation.ok, observation.output)
    pieces += [_marker(tokenizer, specials.tool), _marker(tokenizer, start),
               tokenizer.encode(text[len(start):-len(end)]), _marker(tokenizer, end),
               _marker(tokenizer, specials.end)]
  pieces.append(_marker(tokenizer, specials.assistant))
  return np.concatenate(pieces).astype(np.int32)


def summary_request_ids(tokenizer: Tokenizer, summary_prompt: str) -> np.ndarray:
  return np.concatenate([message_ids(tokenizer, "user", summary_prompt),
                         _marker(tokenizer, tokenizer.specials.assistant)]).astype(np.int32)


def turn_spans(tokenizer: Tokenizer, turn_ids) -> np.ndarray:
  """bool [N]: which of a turn's sampled tokens lie inside tool-call blocks (markers
  included); the rest is thinking or the final message."""
  open_id = tokenizer.token_id(protocol.TOOL_CALL_START)
  close_id = tokenizer.token_id(protocol.TOOL_CALL_END)
  inside, spans = False, np.zeros(len(turn_ids), bool)
  for i, token in enumerate(np.asarray(turn_ids).tolist()):
    if token == open_id:
      inside = True
    spans[i] = inside
    if token == close_id:
      inside = False
  return spans


def history_text(task_prompt: str, messages: list[dict]) -> str:
  """A conversation (OpenAI-style messages) as plain text for a compaction call: the task,
  then every message in order, tool calls written as name(arguments) so no tool-call
  marker appears."""
  lines = [f"Task: {task_prompt}"]
  for message in messages:
    content = message.get("content") or ""
    if message["role"] == "assistant":
      calls = [f"call {c['function']['name']}({c['function']['arguments']})"
               for c in message.get("tool_calls", ())]
      lines.append("Agent: " + "\n".join([content] + calls if content else calls))
    elif message["role"] == "tool":
      lines.append(f"Result of {message.get('name', 'a tool')}: {content}")
    else:
      lines.append(f"{message['role'].capitalize()}: {content}")
  return "\n\n".join(lines)


def compaction_ids(tokenizer: Tokenizer, instruction: str, history: str,
                   max_tokens: int) -> np.ndarray | None:
  """A compaction call's prompt of at most `max_tokens`: the instruction as the system
  message, the history as the user message, its oldest tokens dropped to fit (None when
  not even one history token fits)."""
  specials = tokenizer.specials
  head = np.concatenate([_marker(tokenizer, specials.bos),
                         message_ids(tokenizer, "system", instruction),
                         _marker(tokenizer, specials.user)])
  tail = np.concatenate([_marker(tokenizer, specials.end),
                         _marker(tokenizer, specials.assistant)])
  keep = max_tokens - len(head) - len(tail)
  if keep < 1:
    return None
  body = np.asarray(tokenizer.encode(history), np.int32)[-keep:]
  return np.concatenate([head, body, tail]).astype(np.int32)
