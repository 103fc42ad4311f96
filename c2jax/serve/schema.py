"""Request bodies of the OpenAI API subset `c2jax serve` implements, and its error body.

Fields the server does not know are accepted and ignored (clients send many); known
fields are type-checked, and a value the server cannot honour (n > 1, echo, tool_choice
"required", ...) is a 400 naming the parameter instead of being silently dropped.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import pydantic


class APIError(Exception):
  """An OpenAI-style error: HTTP status + {"error": {message, type, param, code}}."""

  def __init__(self, status: int, message: str, param: str | None = None,
               code: str | None = None, kind: str = "invalid_request_error"):
    super().__init__(message)
    self.status, self.message, self.param, self.code, self.kind = (status, message, param,
                                                                    code, kind)

  def body(self) -> dict:
    return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                      "code": self.code}}


class _Body(pydantic.BaseModel):
  model_config = pydantic.ConfigDict(extra="allow", strict=False)


Body = _Body  # the base of request bodies defined beside their routes (tokenizer_routes)


class StreamOptions(_Body):
  include_usage: bool = False


class Sampling(_Body):
  """Fields both endpoints share."""
  model: str
  temperature: float = pydantic.Field(1.0, ge=0.0, le=2.0)
  top_p: float = pydantic.Field(1.0, gt=0.0, le=1.0)
  top_k: int = pydantic.Field(0, ge=0)  # an extension (vLLM has it too); 0 = off
  max_tokens: int | None = pydantic.Field(None, ge=1)
  stop: str | list[str] | None = None
  seed: int | None = None
  n: int = pydantic.Field(1, ge=1)
  stream: bool = False
  stream_options: StreamOptions | None = None
  user: str | None = None

  def stop_strings(self) -> tuple[str, ...]:
    stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
    if len(stops) > 4 or any(not s for s in stops):
      raise APIError(400, "stop takes at most 4 non-empty strings.", "stop")
    return tuple(stops)

  def check_n(self, prompts: int, max_choices: int) -> None:
    """n choices for each of `prompts` prompts: at most max_choices, and one if streamed."""
    if self.n * prompts > max_choices:
      raise APIError(400, f"n = {self.n} for {prompts} prompt(s) asks for {self.n * prompts} "
                     f"choices; this server returns at most {max_choices} per request. "
                     "Split the request (concurrent requests are batched together).", "n")
    if self.stream and self.n * prompts > 1:
      raise APIError(400, f"stream = true returns one choice; this request asks for "
                     f"{self.n * prompts} (n = {self.n}, {prompts} prompt(s)). Send it "
                     "without stream, or one streamed request per choice.", "stream")


class FunctionCall(_Body):
  name: str
  arguments: str | dict = "{}"


class ToolCall(_Body):
  id: str | None = None
  type: Literal["function"] = "function"
  function: FunctionCall


class Message(_Body):
  role: str
  content: str | list[dict[str, Any]] | None = None
  tool_calls: list[ToolCall] | None = None
  tool_call_id: str | None = None
  name: str | None = None

  def text(self, index: int) -> str | None:
    """Content as one string; text parts of multi-part content are joined."""
    if not isinstance(self.content, list):
      return self.content
    texts = []
    for part in self.content:
      if part.get("type") != "text" or not isinstance(part.get("text"), str):
        raise APIError(400, f"messages[{index}].content has a part of type "
                       f"{part.get('type')!r}; this model reads text parts only.",
                       f"messages[{index}].content")
      texts.append(part["text"])
    return "".join(texts)


class Function(_Body):
  name: str
  description: str = ""
  parameters: dict[str, Any] = pydantic.Field(
      default_factory=lambda: {"type": "object", "properties": {}})


class Tool(_Body):
  type: Literal["function"]
  function: Function


class ChatRequest(Sampling):
  messages: list[Message] = pydantic.Field(min_length=1)
  max_completion_tokens: int | None = pydantic.Field(None, ge=1)
  tools: list[Tool] | None = None
  tool_choice: str | dict | None = None
  parallel_tool_calls: bool | None = None
  logprobs: bool = False
  top_logprobs: int | None = pydantic.Field(None, ge=0, le=20)

  def limit(self) -> int | None:
    return self.max_completion_tokens or self.max_tokens


class CompletionRequest(Sampling):
  prompt: str | list[int] | list[str] | list[list[int]]
  # 16 is the OpenAI default for completions; 0 only with echo (score the prompt).
  max_tokens: int | None = pydantic.Field(16, ge=0)
  logprobs: int | None = pydantic.Field(None, ge=0, le=20)
  echo: bool = False
  best_of: int | None = None
  suffix: str | None = None


_TYPES = ("str", "int", "float", "bool", "dict", "list", "none")


def parse(model_class: type[_Body], payload: Any) -> _Body:
  """The validated body, or an APIError naming the first offending field."""
  if not isinstance(payload, dict):
    raise APIError(400, f"the request body must be a JSON object, got "
                   f"{type(payload).__name__}.")
  try:
    return model_class.model_validate(payload)
  except pydantic.ValidationError as e:
    error = e.errors()[0]
    # Union members add their type names to loc (e.g. 'str', 'list[int]'); keep the
    # field names and list indices only.
    param = ".".join(str(p) for p in error["loc"]
                     if isinstance(p, int) or (re.fullmatch(r"[a-z_]+", p) and p not in _TYPES))
    if error["type"] == "missing":
      message = f"missing required parameter {param!r}."
    else:
      got = repr(error.get("input"))
      got = got if len(got) <= 200 else got[:200] + "..."  # the input may be megabytes
      message = f"invalid value for {param!r}: {error['msg']} (got {got})."
    raise APIError(400, message, param or None,
                   "missing_required_parameter" if error["type"] == "missing"
                   else "invalid_value") from e
