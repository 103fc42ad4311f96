"""What `c2jax serve` checks before any work starts, so no request can stall or crash it.

    limits = Limits(max_body_bytes=8 * 2**20)
    payload = await read_payload(http, limits)      # 413 / 400, parsed off the event loop

A request body passes these gates in order, each failing with an OpenAI-style error that
names what was wrong:
  1. size: a Content-Length over `max_body_bytes`, or a body that grows past it while it
     arrives, is a 413 (nothing past the limit is read);
  2. JSON: parsed on a worker thread (a large body never blocks the event loop that
     answers /health and streams other clients' tokens); nesting deeper than
     `max_json_depth` is a 400 (`deep`), never a RecursionError;
  3. text: a string that cannot be encoded as UTF-8 (a lone surrogate escape such as
     "\\ud800", which JSON allows and no tokenizer can encode) is refused with a 400 naming
     the field: the server serves token ids exactly, so it does not silently replace text;
  4. tools: each tool's `parameters` must be a JSON Schema (checked against the
     metaschema) describing an object, as OpenAI requires;
  5. prompt length: text whose character count already exceeds what the context could
     hold is refused before it is tokenised. No token covers more bytes than the
     vocabulary's longest token, so `len(text) > max_length * longest_token_bytes` proves
     the prompt too long without tokenising it; shorter text is tokenised (off the event
     loop) and checked exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable

import fastapi
import jsonschema
from starlette.concurrency import run_in_threadpool

from c2jax.serve.schema import APIError


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one request may ask of the server (c2jax serve's --max_body_mb and friends)."""
  # A JSON body is parsed in one call that holds the interpreter (~1 s for 8 MiB of small
  # numbers on a loaded 2-core VM): the size limit bounds that pause for other clients.
  max_body_bytes: int = 8 * 2**20
  max_json_depth: int = 64
  # Completions (prompts x n) or chat choices (n) one request may ask for.
  max_choices: int = 128

  def __post_init__(self):
    for name in ("max_body_bytes", "max_json_depth", "max_choices"):
      if getattr(self, name) < 1:
        raise ValueError(f"Limits.{name} = {getattr(self, name)}; use >= 1.")


async def read_payload(http: fastapi.Request, limits: Limits):
  """The parsed JSON body, checked by gates 1-3 of the module docstring."""
  declared = http.headers.get("content-length")
  if declared is not None:
    try:
      size = int(declared)
    except ValueError:
      raise APIError(400, f"Content-Length {declared[:40]!r} is not a number.") from None
    if size > limits.max_body_bytes:
      raise _too_large(size, limits, counted=False)
  chunks, size = [], 0
  async for chunk in http.stream():
    size += len(chunk)
    if size > limits.max_body_bytes:
      raise _too_large(size, limits, counted=True)
    chunks.append(chunk)
  return await run_in_threadpool(parse_payload, b"".join(chunks), limits)


def _too_large(size: int, limits: Limits, counted: bool) -> APIError:
  """counted: the size was counted while the body streamed in (it has at least that
  many bytes), not declared by Content-Length."""
  return APIError(413, f"the request body has {'at least ' if counted else ''}{size} bytes; this "
                  f"server takes at most {limits.max_body_bytes} (c2jax serve "
                  "--max_body_mb). Send a shorter prompt.", None, "request_too_large")


def parse_payload(raw: bytes, limits: Limits):
  try:
    payload = json.loads(raw)
  except RecursionError:
    raise _too_deep("", limits.max_json_depth) from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise APIError(400, f"the request body is not valid JSON ({e}); send a JSON object "
                   "with Content-Type: application/json.") from e
  check_structure(payload, limits.max_json_depth)
  return payload


def _too_deep(param: str, max_depth: int) -> APIError:
  return APIError(400, f"the request body nests deeper than {max_depth} levels"
                  f"{' at ' + param if param else ''}; no parameter of this API needs that.",
                  param or None, "invalid_value")


def check_structure(payload, max_depth: int) -> None:
  """Walks the parsed body without recursion: depth bound and encodable text. Paths are
  worked out only for a failure, so a body of millions of numbers walks in one pass of
  type checks."""
  if isinstance(payload, str):
    _check_text(payload, payload)
  stack = [(payload, 1)] if isinstance(payload, (dict, list)) else []
  while stack:
    value, depth = stack.pop()
    if depth > max_depth:
      raise _too_deep(_param(_path_to(payload, value)), max_depth)
    if isinstance(value, dict):
      for key in value:
        if not key.isascii():
          _check_text(payload, key)
      items = value.values()
    else:
      items = value
    for item in items:
      kind = type(item)
      if kind is str:
        if not item.isascii():
          _check_text(payload, item)
      elif kind is dict or kind is list:
        stack.append((item, depth + 1))


def _path_to(payload, target) -> tuple:
  """The keys and indices that lead from payload to the object `target` (or to a dict
  that has `target` as a key)."""
  stack = [(payload, ())]
  while stack:
    value, path = stack.pop()
    if value is target:
      return path
    if isinstance(value, dict):
      for key, item in value.items():
        if key is target:
          return path
        stack.append((item, path + (key,)))
    elif isinstance(value, list):
      stack.extend((item, path + (index,)) for index, item in enumerate(value))
  return ()


def _check_text(payload, text: str) -> None:
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    param = _param(_path_to(payload, text))
    raise APIError(400, f"{param or 'the request body'} holds the lone surrogate "
                   f"{text[e.start]!r} at character {e.start}, which is not a Unicode "
                   "character and cannot be encoded; send valid UTF-8 text (pair the "
                   "surrogate or drop it).", param or None, "invalid_value") from None


def _param(path: Iterable) -> str:
  return ".".join(str(p) for p in path)


def check_tool_schemas(tools) -> None:
  """Each tool's `parameters` is an object JSON Schema (else a 400 naming the tool)."""
  for index, tool in enumerate(tools or ()):
    param = f"tools.{index}.function.parameters"
    schema = tool.function.parameters
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
      validator.check_schema(schema)
    except jsonschema.SchemaError as e:
      where = "/".join(str(p) for p in e.absolute_path) or "(top level)"
      raise APIError(400, f"{param} (tool {tool.function.name!r}) is not a valid JSON "
                     f"Schema: at {where}: {_short(e.message)}", param,
                     "invalid_value") from None
    properties = schema.get("properties", {})
    odd = [name for name, prop in properties.items() if not isinstance(prop, dict)]
    if odd:  # valid JSON Schema (true / false), but they describe no argument
      raise APIError(400, f"{param}.properties.{_short(odd[0])} (tool "
                     f"{tool.function.name!r}) is {properties[odd[0]]!r}; describe each "
                     "argument by an object schema, e.g. {\"type\": \"string\"}.", param,
                     "invalid_value")
    if schema.get("type", "object") != "object":
      raise APIError(400, f"{param} (tool {tool.function.name!r}) has type "
                     f"{_short(repr(schema.get('type')))}; a function's parameters are an "
                     "object schema ({\"type\": \"object\", \"properties\": {...}}).", param,
                     "invalid_value")


def _short(text: str, limit: int = 200) -> str:
  return text if len(text) <= limit else text[:limit] + "..."


@functools.cache
def longest_token_bytes(tokenizer) -> int:
  """The most bytes any ordinary token of `tokenizer` stands for (>= 1)."""
  longest = 1
  for token in range(tokenizer.vocab_size):
    try:
      longest = max(longest, len(tokenizer.token_bytes(token)))
    except ValueError:
      continue  # an id the tokenizer leaves unassigned
  return longest


def check_text_length(tokenizer, max_length: int, texts: Iterable[str], param: str) -> None:
  """Gate 5 of the module docstring, for text that will all be tokenised into one prompt."""
  chars = sum(len(t) for t in texts if t)
  cap = max_length * longest_token_bytes(tokenizer)
  if chars > cap:
    raise APIError(400, f"This model's maximum context length is {max_length} tokens; the "
                   f"prompt has {chars} characters, more than {max_length} tokens can hold "
                   f"(no token is longer than {cap // max_length} bytes). Shorten the "
                   f"{param} or start the server with a larger --max_length.", param,
                   "context_length_exceeded")
