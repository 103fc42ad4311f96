"""A model's own Jinja chat template, rendered the way transformers' apply_chat_template does.

    rendered = apply(tokenizer, messages, tools=specs, add_generation_prompt=False)
    rendered.ids, rendered.loss_mask, rendered.text

Templates from the Hub are untrusted code, so they run in Jinja's ImmutableSandboxedEnvironment
with transformers' settings (trim_blocks, lstrip_blocks, loop controls) and helpers
(`raise_exception`, a `tojson` that does not HTML-escape, `strftime_now`, `dict`, a
`namespace` that refuses underscore names). The template sees `messages`, `tools`,
`documents`, `add_generation_prompt`, the tokenizer's named special tokens (`bos_token`,
`eos_token`, ...) and any extra keyword (e.g. `enable_thinking`).

`{% generation %}...{% endgeneration %}` marks what the assistant produces. The loss mask is
1 on every token whose character span overlaps a generation block, which is exactly
transformers' `return_assistant_tokens_mask=True` (tests compare against fixtures made by
transformers). A template without generation blocks gets an all-zero mask and a warning,
as in transformers; SFT and the agent then find assistant turns by template_turns.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import re
from contextvars import ContextVar

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
import numpy as np
from absl import logging
from jinja2.sandbox import ImmutableSandboxedEnvironment

_GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Active while one render collects its output blocks and generation spans.
_TRACKING: ContextVar = ContextVar("c2jax_generation_tracking", default=None)


@dataclasses.dataclass(frozen=True)
class Rendered:
  text: str
  ids: np.ndarray  # int32 [T]
  loss_mask: np.ndarray  # int32 [T]; 1 on tokens inside {% generation %} blocks
  spans: tuple[tuple[int, int], ...]  # character spans of the generation blocks


class _GenerationTracker(jinja2.ext.Extension):
  """`{% generation %}` blocks render their body unchanged and record its character span
  in the output rendered so far."""
  tags = {"generation"}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2.nodes.CallBlock(self.call_method("_track"), [], [], body).set_lineno(lineno)

  def _track(self, caller):
    text = caller()
    tracking = _TRACKING.get()
    if tracking is not None:
      blocks, spans = tracking
      start = sum(len(b) for b in blocks)
      spans.append((start, start + len(text)))
    return text


class _Namespace(jinja2.utils.Namespace):
  """`namespace(...)` that refuses underscore names (no reach into Python internals)."""

  def __init__(*args, **kwargs):  # pylint: disable=no-method-argument
    self, args = args[0], args[1:]
    attrs = dict(*args, **kwargs)
    for name in attrs:
      _Namespace._check(name)
    jinja2.utils.Namespace.__init__(self, attrs)

  def __setitem__(self, name, value):
    _Namespace._check(name)
    jinja2.utils.Namespace.__setitem__(self, name, value)

  @staticmethod
  def _check(name):
    if isinstance(name, str) and name.startswith("_"):
      raise jinja2.exceptions.SecurityError(
          f"chat templates may not set underscore attributes on a namespace ({name!r}).")


class _Dict:
  """`dict(...)` in templates, without exposing the type itself."""

  def __call__(self, *args, **kwargs):
    return dict(*args, **kwargs)

  def fromkeys(self, *args, **kwargs):
    return dict.fromkeys(*args, **kwargs)


def _raise_exception(message):
  raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  # Jinja's own tojson HTML-escapes '<', '>', '&', which no model was trained on.
  return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)


def _strftime_now(fmt):
  return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
  """The sandboxed, compiled template (cached: datasets render thousands of chats)."""
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[_GenerationTracker, jinja2.ext.loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                     dict=_Dict(), namespace=_Namespace)
  try:
    return env.from_string(source)
  except jinja2.TemplateSyntaxError as e:
    raise ValueError(f"the chat template does not parse (line {e.lineno}: {e.message}); "
                     "fix chat_template.jinja or tokenizer_config.json.") from e


def _plain(value, where: str):
  """A JSON-typed copy of what the template sees (no objects with methods in the sandbox)."""
  if value is None or type(value) in (str, int, float, bool):
    return value
  if isinstance(value, str):  # subclasses (enums, ...) back to the base type
    return str.__str__(value)
  if isinstance(value, int):
    return int.__int__(value)
  if isinstance(value, float):
    return float.__float__(value)
  if isinstance(value, np.generic):
    return _plain(value.item(), where)
  if isinstance(value, dict):
    return {_plain(k, where): _plain(v, where) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v, where) for v in value]
  raise TypeError(f"{where}: a {type(value).__name__} cannot be passed to a chat template; "
                  "use JSON types (str, number, bool, list, dict).")


def _normalise(messages) -> list[dict]:
  """transformers' message normalisation: None-valued keys dropped (templates test for
  missing keys), reasoning aliased under `reasoning_content` and `thinking`."""
  result = []
  for i, message in enumerate(messages):
    if not isinstance(message, dict):
      raise TypeError(f"message {i} is a {type(message).__name__}; messages are dicts with "
                      "'role' and 'content'.")
    message = {k: _plain(v, f"message {i}") for k, v in message.items() if v is not None}
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None),
                     None)
    if reasoning is not None:
      message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    result.append(message)
  return result


def render_text(source: str, messages, *, tools=None, add_generation_prompt: bool = False,
                **kwargs) -> tuple[str, list[tuple[int, int]]]:
  """The rendered conversation and the character spans of its generation blocks."""
  template = compile_template(source)
  variables = dict(_plain(kwargs, "template keyword"),
                   messages=_normalise(messages),
                   tools=_plain(list(tools), "tools") if tools is not None else None,
                   documents=None, add_generation_prompt=add_generation_prompt)
  blocks, spans = [], []
  token = _TRACKING.set((blocks, spans))
  try:
    for block in template.generate(**variables):
      blocks.append(block)
  except jinja2.TemplateError as e:
    raise ValueError(f"the chat template refused the conversation: {e}") from e
  finally:
    _TRACKING.reset(token)
  return "".join(blocks), spans


def spans_to_mask(offsets: np.ndarray, spans) -> np.ndarray:
  """int32 [T]: 1 where a token's [start, end) characters overlap a span (transformers'
  rule; spans and offsets are both in order)."""
  mask = np.zeros(len(offsets), np.int32)
  span = 0
  for t, (start, end) in enumerate(np.asarray(offsets).tolist()):
    while span < len(spans) and start >= spans[span][1]:
      span += 1
    if span == len(spans):
      break
    if end > spans[span][0]:
      mask[t] = 1
  return mask


def apply(tokenizer, messages, *, tools=None, add_generation_prompt: bool = False,
          template_name: str | None = None, **kwargs) -> Rendered:
  """Renders `messages` with the tokenizer's own chat template and tokenises the text."""
  source = tokenizer.template(template_name, tools=tools is not None)
  if not _GENERATION_RE.search(source):
    logging.log_first_n(logging.WARNING, "the chat template of %s has no {%% generation %%} "
                        "block, so its assistant mask is all zeros.", 1, tokenizer.directory)
  variables = {**tokenizer.special_tokens, **kwargs}
  text, spans = render_text(source, messages, tools=tools,
                            add_generation_prompt=add_generation_prompt, **variables)
  return tokenize(tokenizer, text, spans)


def tokenize(tokenizer, text: str, spans) -> Rendered:
  """Rendered text -> ids and the mask of tokens overlapping `spans`."""
  ids, offsets = tokenizer.encode_chat(text)
  return Rendered(text, ids, spans_to_mask(offsets, spans), tuple(spans))


# Private-use characters around a control-token string that came from untrusted text, so
# `encode_marked` encodes it as plain text (transformers' sanitize_control_tokens idea).
MARK_OPEN, MARK_CLOSE = "\ue000", "\ue001"


def mark_control_tokens(value, control_tokens):
  """A copy of `value` (str / list / dict) whose strings have every control token wrapped
  in MARK_OPEN/MARK_CLOSE; stray marker characters in the input are dropped."""
  if isinstance(value, str):
    value = value.replace(MARK_OPEN, "").replace(MARK_CLOSE, "")
    pattern = _control_pattern(tuple(control_tokens))
    return pattern.sub(lambda m: MARK_OPEN + m.group(0) + MARK_CLOSE, value) if pattern else value
  if isinstance(value, dict):
    return {k: mark_control_tokens(v, control_tokens) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [mark_control_tokens(v, control_tokens) for v in value]
  return value


@functools.lru_cache(maxsize=8)
def _control_pattern(control_tokens: tuple[str, ...]):
  if not control_tokens:
    return None
  return re.compile("|".join(re.escape(t) for t in sorted(control_tokens, key=len,
                                                          reverse=True)))


def encode_marked(tokenizer, text: str) -> np.ndarray:
  """Ids of rendered text in which marked regions are plain text and the rest is
  encoded as the template's (control tokens matched)."""
  pieces, pos = [], 0
  while (start := text.find(MARK_OPEN, pos)) >= 0:
    end = text.find(MARK_CLOSE, start)
    end = len(text) if end < 0 else end
    pieces += [tokenizer.encode_chat(text[pos:start])[0], tokenizer.encode(text[start + 1:end])]
    pos = end + 1
  pieces.append(tokenizer.encode_chat(text[pos:])[0])
  return np.concatenate(pieces).astype(np.int32)


def has_generation_blocks(tokenizer, template_name: str | None = None) -> bool:
  return bool(_GENERATION_RE.search(tokenizer.template(template_name)))


def load_jsonl(path: str) -> list[dict]:
  """Conversations for a model's own template: each line `{"messages": [...], "tools":
  [...]}` (tools optional) or a bare message list; messages are passed to the template as
  written (OpenAI style), after checking each has a string role."""
  conversations = []
  with open(path, encoding="utf-8") as f:
    for line_number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{line_number}"
      try:
        item = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg}).") from e
      item = item if isinstance(item, dict) else {"messages": item}
      messages, tools = item.get("messages"), item.get("tools")
      if not isinstance(messages, list) or not all(
          isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise ValueError(f"{where}: expected {{\"messages\": [{{\"role\": ..., ...}}, ...]}} "
                         "or a list of such messages.")
      if tools is not None and not isinstance(tools, list):
        raise ValueError(f"{where}: \"tools\" must be a list of tool schemas.")
      conversations.append({"messages": messages, "tools": tools})
  return conversations
