"""Where assistant turns are in a chat template's output when it marks no {% generation %}.

Most released templates (Qwen3's, Kimi-K2's) do not mark generation, so transformers'
assistant mask is all zeros for them. The agent still has to know where a turn ends, and
SFT what to train on; both use the same rule, which is what a model emits when it is
prompted with the template's generation prompt:

  turn = text from the end of the generation prompt (render of the messages before the
         assistant message, add_generation_prompt=True) to the first closing token after it
  closing token = the first control token the template writes after an assistant's text
         (e.g. <|im_end|>); with {% generation %} blocks, the one that ends a block.

A template whose generation prompt is not a prefix of the assistant's rendered turn cannot
be read this way, and the error says to add {% generation %} blocks.
"""

from __future__ import annotations

from c2jax.data import chat_template

_PROBE = "c2jax probe reply"


def _render(tokenizer, messages, tools=None, add_generation_prompt=False):
  source = tokenizer.template(tools=tools is not None)
  return chat_template.render_text(source, messages, tools=tools,
                                   add_generation_prompt=add_generation_prompt,
                                   **tokenizer.special_tokens)


def _not_a_prefix(tokenizer) -> ValueError:
  return ValueError(f"the chat template of {tokenizer.directory} has no {{% generation %}} "
                    "block and its generation prompt does not begin the assistant's turn, so "
                    "where a turn is cannot be told; wrap assistant output in "
                    "{% generation %}...{% endgeneration %}.")


def assistant_text(tokenizer, assistant: dict, close: str | None) -> str:
  """What the template writes for `assistant` after one user message: its generation span,
  else the text from the generation prompt to `close` (everything, when `close` is None)."""
  history = [{"role": "user", "content": "x"}]
  text, spans = _render(tokenizer, history + [assistant])
  if spans:
    return text[spans[-1][0]:spans[-1][1]]
  prompt = _render(tokenizer, history, add_generation_prompt=True)[0]
  if not text.startswith(prompt):
    raise _not_a_prefix(tokenizer)
  rest = text[len(prompt):]
  return rest if close is None or close not in rest else rest[:rest.index(close) + len(close)]


def closing_token(tokenizer) -> str:
  """The control token that ends an assistant turn (see the module docstring)."""
  written = assistant_text(tokenizer, {"role": "assistant", "content": _PROBE}, None)
  tail = written[written.find(_PROBE) + len(_PROBE):]
  found = [(tail.find(t), -len(t), t) for t in tokenizer.control_tokens if t in tail]
  if not found:
    raise ValueError(f"the chat template of {tokenizer.directory} ends an assistant turn with "
                     f"no control token ({tail[:40]!r}); a model needs one to stop on.")
  return min(found)[2]


def find_unmarked(text: str, token: str, start: int) -> int:
  """Index of the first `token` at or after `start` outside marked (untrusted) text."""
  pos = start
  while (found := text.find(token, pos)) >= 0:
    opened = text.rfind(chat_template.MARK_OPEN, start, found)
    if opened < 0 or text.rfind(chat_template.MARK_CLOSE, opened, found) >= 0:
      return found
    pos = found + 1
  return -1


def turn_spans(tokenizer, messages: list[dict], tools=None) -> tuple[str, list]:
  """The rendered conversation and the character span of each assistant turn, closing
  token included, by the rule above (for templates without {% generation %})."""
  close = closing_token(tokenizer)
  text, _ = _render(tokenizer, messages, tools)
  spans = []
  for i, message in enumerate(messages):
    if message.get("role") != "assistant":
      continue
    prompt = _render(tokenizer, messages[:i], tools, add_generation_prompt=True)[0]
    end = text.find(close, len(prompt))
    if not text.startswith(prompt) or end < 0:
      raise _not_a_prefix(tokenizer)
    spans.append((len(prompt), end + len(close)))
  return text, spans
