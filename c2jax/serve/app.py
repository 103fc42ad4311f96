"""What the FastAPI routes serve: the Service (an EngineLoop over one engine, its tokenizer,
token capture) and the pieces every endpoint shares (sampling checks, log-probs, SSE, JSON
bodies). The routes and `create_app` are in endpoints.py, which builds on this module.

Handlers validate and render on the event loop, hand a rollout Request to the engine
thread, and await its events (engine_loop.py). A non-streaming handler watches for the
client going away while it waits; a streaming one notices when its response generator is
closed; either way the request is cancelled in the engine and its slot freed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import fastapi
import numpy as np
from fastapi import responses

from c2jax.data.tokenizer import Tokenizer
from c2jax.rollout import Engine, Request, SamplingParams
from c2jax.serve import capture as capture_lib
from c2jax.serve import prompts, schema, validation
from c2jax.serve.engine_loop import EngineLoop, EngineUnavailable, Stream

_DISCONNECT_POLL_S = 0.25



def checked_chat_prompt(service: "Service", request: schema.ChatRequest):
  """(tool specs, prompt ids) of a chat request, after the checks every chat route
  makes first (/v1/chat/completions and /tokenize alike): the tool schemas, and the
  length of the messages and tool descriptions against the engine's context."""
  validation.check_tool_schemas(request.tools)
  specs = prompts.tool_specs(request)
  texts = [message.text(i) for i, message in enumerate(request.messages)]
  texts += [tool.function.description for tool in request.tools or ()]
  validation.check_text_length(service.tokenizer, service.engine.max_length, texts,
                               "messages")
  return specs, prompts.chat_prompt(service.tokenizer, request, specs, service.turns)

class Service:
  """What the app serves: one engine (driven by its own thread), its tokenizer, a name."""

  def __init__(self, engine: Engine, tokenizer: Tokenizer, model_name: str, *,
               vocab_size: int, capture_path: str | None = None,
               limits: validation.Limits = validation.Limits(),
               api_key: str | None = None, trace=None, on_fatal=None):
    """trace: a c2jax.train.profiling.StepTrace of chosen engine steps (or None);
    on_fatal: EngineLoop's (an engine over several processes stops the server)."""
    self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
    self.vocab_size = vocab_size
    self.limits = limits
    self.api_key = api_key  # None: no authentication (auth.py)
    self.loop = EngineLoop(engine, trace, on_fatal)
    self.capture = capture_lib.CaptureWriter(capture_path) if capture_path else None
    self.turns = prompts.TurnMemory()
    self.created = int(time.time())

  def start(self) -> "Service":
    self.loop.start()
    return self

  def close(self) -> None:
    self.loop.stop()
    if self.capture is not None:
      self.capture.close()

  # ---- one request ---------------------------------------------------------------------
  def sampling(self, request: schema.Sampling, limit: int | None, prompt_length: int,
               stop_ids: tuple[int, ...], param: str = "messages") -> SamplingParams:
    max_length = self.engine.max_length
    if prompt_length + 1 > max_length:
      raise schema.APIError(
          400, f"This model's maximum context length is {max_length} tokens; the prompt "
          f"has {prompt_length} tokens, leaving no room to generate. Shorten the "
          f"{param} or start the server with a larger --max_length.", param,
          "context_length_exceeded")
    room = max_length - prompt_length
    # top_k >= the vocabulary keeps every token, as 0 does; clamped, any integer is safe
    # to hand the engine (its batch holds int32s).
    return SamplingParams(temperature=request.temperature,
                          top_k=min(request.top_k, self.vocab_size),
                          top_p=request.top_p, max_tokens=min(limit or room, room),
                          stop_tokens=stop_ids, stop_strings=request.stop_strings(),
                          # The sampler keys on 32-bit seeds; clients send any integer.
                          seed=None if request.seed is None else request.seed % 2**32,
                          # Computed when the client asks (chat `logprobs: true`, legacy
                          # `logprobs: N` from 0) or the capture records them.
                          logprobs=self.capture is not None or _wants_logprobs(request))

  def check_model(self, request: schema.Sampling) -> None:
    # "<name>@<tag>" is the served model too: the tag goes into the capture so one
    # harness episode's requests can be told apart from another's (c2jax/agent/external).
    if request.model != self.model_name and not request.model.startswith(
        self.model_name + "@"):
      raise schema.APIError(404, f"model {request.model!r} is not served here; this server "
                            f"serves {self.model_name!r} (see GET /v1/models).", "model",
                            "model_not_found")

  def record(self, endpoint: str, request_id: str, generation, times: dict,
             sampling: SamplingParams, requested_model: str | None = None) -> None:
    if self.capture is None:
      return
    settings = {k: getattr(sampling, k) for k in ("temperature", "top_k", "top_p",
                                                   "max_tokens", "seed")}
    settings["stop_tokens"] = list(sampling.stop_tokens)
    settings["stop_strings"] = list(sampling.stop_strings)
    self.capture.write(capture_lib.record(
        request_id=request_id, endpoint=endpoint, model=requested_model or self.model_name,
        generation=generation, timestamps=times, sampling=settings))

  def remember_turn(self, final, generation) -> None:
    """Keeps a chat reply's sampled tokens (its closing <|end|> or <|eos|> left to the
    template) for when the client sends it back as history."""
    if generation.finish_reason == "stop_string":
      return  # the client saw text cut before the stop string; its tokens hold more
    tokens = generation.tokens
    if generation.finish_reason == "stop_token":
      tokens = tokens[:-1]
    self.turns.remember(prompts.turn_key(final.content, final.tool_calls), tokens)

  def token_text(self, token: int) -> str:
    return self.tokenizer.decode([token])

  def token_bytes(self, token: int) -> bytes:
    # A model's vocabulary may be padded past the tokenizer's; such ids have no text.
    if token >= self.tokenizer.vocab_size:
      return b""
    return self.tokenizer.token_bytes(token)


class Pending:
  """An admitted request seen from the event loop: its stream and event queue."""

  def __init__(self, service: Service, request: Request, *, stream: bool):
    loop = asyncio.get_running_loop()
    self.queue: asyncio.Queue = asyncio.Queue()
    self.service = service
    self.times = {"created": time.time(), "first_token": None, "finished": None}

    def deliver(event):
      loop.call_soon_threadsafe(self.queue.put_nowait, event)

    self.stream = service.loop.submit(Stream(request, deliver, tokens=stream))

  async def next(self, http: fastapi.Request | None = None):
    """The next event; with `http`, raises ClientGone once the client disconnects."""
    while True:
      try:
        event = await asyncio.wait_for(self.queue.get(), _DISCONNECT_POLL_S)
      except TimeoutError:
        if http is not None and await http.is_disconnected():
          raise ClientGone() from None
        continue
      if event[0] == "done":
        self.times["first_token"] = self.stream.first_token
        self.times["finished"] = time.time()
      if event[0] == "error":
        error = event[1]
        if isinstance(error, ValueError):
          raise schema.APIError(400, str(error))
        if isinstance(error, EngineUnavailable):
          raise schema.APIError(503, str(error), kind="server_error",
                                code="engine_unavailable")
        raise schema.APIError(500, f"the engine failed: {error}", kind="server_error")
      return event

  def cancel(self) -> None:
    self.service.loop.cancel(self.stream)


async def on_engine(service: Service, fn):
  """fn(engine), run on the engine thread; a ValueError becomes a 400."""
  loop = asyncio.get_running_loop()
  future = loop.create_future()

  def deliver(event):
    def settle():
      if future.done():
        return
      if event[0] == "result":
        future.set_result(event[1])
      else:
        future.set_exception(event[1])
    loop.call_soon_threadsafe(settle)

  service.loop.call(fn, deliver)
  try:
    return await future
  except ValueError as e:
    raise schema.APIError(400, str(e)) from e


def _wants_logprobs(request: schema.Sampling) -> bool:
  wanted = getattr(request, "logprobs", None)
  return wanted is not None and wanted is not False


MAX_TOP_LOGPROBS = 20  # OpenAI's bound on logprobs / top_logprobs


async def sampled_top_logprobs(service: Service, prompt, tokens, temperature: float):
  """(ids, log-probs), each [len(tokens), MAX_TOP_LOGPROBS or the vocabulary]: at each
  sampled token's position, the most likely tokens teacher-forced under the same weights
  and temperature. One compiled top-k serves every k a request asks for (each k would
  compile its own program); callers keep the first k."""
  sequence = np.concatenate([np.asarray(prompt, np.int32), np.asarray(tokens, np.int32)])
  top = min(MAX_TOP_LOGPROBS, service.vocab_size)
  ids, values = await on_engine(
      service, lambda engine: engine.top_logprobs(sequence, top, temperature))
  first = len(prompt) - 1  # the position whose next-token distribution sampled tokens[0]
  return ids[first:first + len(tokens)], values[first:first + len(tokens)]


async def alternatives(service: Service, prompt, tokens, k: int, temperature: float):
  """For each sampled token, the k most likely tokens at its position as OpenAI chat
  top_logprobs entries."""
  ids, values = await sampled_top_logprobs(service, prompt, tokens, temperature)
  return [[{"token": service.token_text(int(i)), "logprob": float(v),
            "bytes": list(service.token_bytes(int(i)))}
           for i, v in zip(row_ids[:k], row_values[:k])]
          for row_ids, row_values in zip(ids, values)]


class ClientGone(Exception):
  pass


def error_response(error: schema.APIError) -> responses.JSONResponse:
  return responses.JSONResponse(error.body(), status_code=error.status)


async def read_json(http: fastapi.Request, limits: validation.Limits):
  """The body, size-limited and parsed off the event loop (validation.py)."""
  return await validation.read_payload(http, limits)


def sse(payload: dict | str) -> bytes:
  text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
  return f"data: {text}\n\n".encode()


def usage(generation) -> dict:
  prompt, completion = len(generation.prompt_tokens), len(generation.tokens)
  return {"prompt_tokens": prompt, "completion_tokens": completion,
          "total_tokens": prompt + completion}


def logprob_entries(service: Service, tokens, logprobs) -> list[dict]:
  entries = []
  for token, logprob in zip(tokens, logprobs):
    entries.append({"token": service.token_text(int(token)), "logprob": float(logprob),
                    "bytes": list(service.token_bytes(int(token))),
                    "top_logprobs": []})
  return entries


def new_id(prefix: str) -> str:
  return f"{prefix}-{uuid.uuid4().hex[:24]}"
