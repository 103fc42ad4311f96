"""The app's routes: POST /v1/chat/completions and /v1/completions (plain and
`stream=true`), /v1/models, /health, the OpenAI error bodies, and `create_app`."""

from __future__ import annotations

import time

import fastapi
from absl import logging
from fastapi import responses
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from c2jax.rollout import Request
from c2jax.serve import auth, completions, prompts, schema, tokenizer_routes, validation
from c2jax.serve.engine_loop import EngineUnavailable
from c2jax.serve.app import (Pending, Service, alternatives, checked_chat_prompt,
                             error_response, logprob_entries, new_id, read_json, sse, usage)
from c2jax.serve.output import Output


def _chat_setup(service: Service, payload):
  request = schema.parse(schema.ChatRequest, payload)
  request.check_n(1, service.limits.max_choices)
  service.check_model(request)
  if request.top_logprobs:
    if not hasattr(service.engine, "top_logprobs"):
      raise schema.APIError(400, "top_logprobs: this engine reports the sampled token's "
                            "logprob only; leave top_logprobs unset.", "top_logprobs")
    if request.stream or not request.logprobs:
      raise schema.APIError(400, "top_logprobs needs logprobs = true and is not "
                            "available with stream = true.", "top_logprobs")
  specs, prompt = checked_chat_prompt(service, request)
  specials = service.tokenizer.specials
  stop_ids = (service.tokenizer.token_id(specials.end), service.tokenizer.eos_id)
  sampling = service.sampling(request, request.limit(), len(prompt), stop_ids)
  return request, specs, prompt, sampling


def _completion_setup(service: Service, payload):
  request = schema.parse(schema.CompletionRequest, payload)
  several = (isinstance(request.prompt, list) and request.prompt
             and isinstance(request.prompt[0], (str, list)))
  request.check_n(len(request.prompt) if several else 1, service.limits.max_choices)
  service.check_model(request)
  unsupported = {"echo": request.echo and request.stream,
                 "suffix": request.suffix is not None,
                 "best_of": request.best_of not in (None, 1, request.n)}
  for name, used in unsupported.items():
    if used:
      raise schema.APIError(400, f"{name} = {getattr(request, name)!r} is not supported "
                            "by this server.", name)
  if request.logprobs and not hasattr(service.engine, "top_logprobs"):
    raise schema.APIError(400, f"logprobs = {request.logprobs}: this engine reports the "
                          "chosen token's logprob only; send logprobs = 0.", "logprobs")
  if request.logprobs and request.stream:
    raise schema.APIError(400, f"logprobs = {request.logprobs} (alternatives) is not "
                          "available with stream = true; send logprobs = 0 or no stream.",
                          "logprobs")
  if request.max_tokens == 0 and not request.echo:
    raise schema.APIError(400, "max_tokens = 0 asks for nothing; it is allowed only with "
                          "echo = true (scoring the prompt).", "max_tokens")
  texts = ([request.prompt] if isinstance(request.prompt, str) else
           [p for p in request.prompt if isinstance(p, str)])
  for index, text in enumerate(texts):
    validation.check_text_length(service.tokenizer, service.engine.max_length, [text],
                                 f"prompt.{index}" if several else "prompt")
  prompt_ids = prompts.completion_prompts(service.tokenizer, service.vocab_size, request)
  samplings = [service.sampling(request, request.max_tokens or None, len(ids),
                                (service.tokenizer.eos_id,),
                                f"prompt.{index}" if several else "prompt")
               for index, (ids, _) in enumerate(prompt_ids)]
  return request, prompt_ids, samplings


def _head(service: Service, request_id: str) -> dict:
  return {"id": request_id, "created": int(time.time()), "model": service.model_name,
          "system_fingerprint": f"c2jax-v{service.engine.version}"}


def add_routes(app: fastapi.FastAPI, service: Service) -> None:

  @app.post("/v1/chat/completions")
  async def chat_completions(http: fastapi.Request):
    # Validation, rendering and tokenising run on a worker thread: a large prompt never
    # holds the event loop that answers /health and streams other clients' tokens.
    request, specs, prompt, sampling = await run_in_threadpool(
        _chat_setup, service, await read_json(http, service.limits))
    request_id = new_id("chatcmpl")
    output = Output(service.tokenizer.decode, stop_ids=sampling.stop_tokens,
                    stop_strings=sampling.stop_strings, tools=bool(specs),
                    call_id_prefix="call_" + request_id.split("-")[1][:12])
    head = _head(service, request_id)
    if request.stream:
      return responses.StreamingResponse(
          _chat_stream(service, request, Request(prompt, sampling), output, head),
          media_type="text/event-stream")
    generations = await completions.run_all(
        service, "chat.completions", request_id,
        [Request(prompt, completions.choice_sampling(sampling, j)) for j in range(request.n)],
        http, request.model)
    if generations is None:
      return responses.Response(status_code=499)
    choices = []
    for index, generation in enumerate(generations):
      if index:  # each choice parses its own tokens
        output = Output(service.tokenizer.decode, stop_ids=sampling.stop_tokens,
                        stop_strings=sampling.stop_strings, tools=bool(specs),
                        call_id_prefix=f"call_{request_id.split('-')[1][:12]}{index}")
      choices.append(await _chat_choice(service, request, output, generation, index))
    completion_tokens = sum(len(g.tokens) for g in generations)
    return {**head, "object": "chat.completion", "choices": choices,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens,
                      "total_tokens": len(prompt) + completion_tokens}}

  @app.post("/v1/completions")
  async def text_completions(http: fastapi.Request):
    request, prompt_ids, samplings = await run_in_threadpool(
        _completion_setup, service, await read_json(http, service.limits))
    request_id = new_id("cmpl")
    head = _head(service, request_id)
    if request.stream:  # one prompt, one choice (schema.check_n)
      [(prompt, _)], [sampling] = prompt_ids, samplings
      output = Output(service.tokenizer.decode, stop_ids=sampling.stop_tokens,
                      stop_strings=sampling.stop_strings, tools=False, call_id_prefix="")
      return responses.StreamingResponse(
          _completion_stream(service, request, Request(prompt, sampling), output, head),
          media_type="text/event-stream")
    body = await completions.respond(service, request, prompt_ids, samplings, http, head)
    if body is None:
      return responses.Response(status_code=499)
    return body

  tokenizer_routes.add_routes(app, service)


async def _chat_choice(service: Service, request, output: Output, generation,
                       index: int) -> dict:
  final, _ = output.final(generation.tokens.tolist(), generation.finish_reason)
  service.remember_turn(final, generation)
  message = {"role": "assistant",
             "content": final.content if (final.content or not final.tool_calls) else None}
  if final.tool_calls:
    message["tool_calls"] = final.tool_calls
  choice = {"index": index, "message": message, "finish_reason": final.finish_reason,
            "logprobs": None}
  if final.call_errors:
    choice["c2jax_tool_call_errors"] = final.call_errors
  if request.logprobs:
    entries = logprob_entries(service, generation.tokens, generation.logprobs)
    if request.top_logprobs:
      tops = await alternatives(service, generation.prompt_tokens, generation.tokens,
                                request.top_logprobs, request.temperature)
      for entry, top in zip(entries, tops):
        entry["top_logprobs"] = top
    choice["logprobs"] = {"content": entries}
  return choice


async def _events(pending: Pending):
  """(tokens so far, new tokens, new logprobs, generation or None) per engine event; the
  request is cancelled if the consumer stops early (client disconnect closes us). The
  request is submitted by the response generator itself, once the response streams, so
  a client gone before that never occupies a slot."""
  tokens, finished = [], False
  try:
    while True:
      event = await pending.next()
      if event[0] == "tokens":
        tokens.extend(event[1])
        yield tokens, event[1], event[2], None
      else:
        finished = True
        yield tokens, [], [], event[1]
        return
  finally:
    if not finished:
      pending.cancel()


async def _chat_stream(service, request, engine_request, output, head):
  pending = Pending(service, engine_request, stream=True)
  chunk = {**head, "object": "chat.completion.chunk"}

  def piece(delta, finish=None, logprobs=None):
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    return sse({**chunk, "choices": [choice]})

  yield piece({"role": "assistant", "content": ""})
  try:
    async for tokens, new, new_logprobs, generation in _events(pending):
      if generation is None:
        text = output.delta(tokens)
        logprobs = ({"content": logprob_entries(service, new, new_logprobs)}
                    if request.logprobs else None)
        if text or logprobs:
          yield piece({"content": text}, logprobs=logprobs)
        continue
      service.record("chat.completions", head["id"], generation, pending.times,
                     pending.stream.request.sampling, request.model)
      final, rest = output.final(generation.tokens.tolist(), generation.finish_reason)
      service.remember_turn(final, generation)
      if rest:
        yield piece({"content": rest})
      if final.tool_calls:
        calls = [{"index": k, **call} for k, call in enumerate(final.tool_calls)]
        yield piece({"tool_calls": calls})
      yield piece({}, final.finish_reason)
      options = request.stream_options
      if options is not None and options.include_usage:
        yield sse({**chunk, "choices": [], "usage": usage(generation)})
  except schema.APIError as error:
    yield sse(error.body())
  yield sse("[DONE]")


async def _completion_stream(service, request, engine_request, output, head):
  pending = Pending(service, engine_request, stream=True)
  chunk = {**head, "object": "text_completion"}

  def piece(text, finish=None, logprobs=None):
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}
    return sse({**chunk, "choices": [choice]})

  try:
    async for tokens, new, new_logprobs, generation in _events(pending):
      if generation is None:
        text = output.delta(tokens)
        logprobs = (completions.legacy_logprobs(
            service, new, new_logprobs,
            [{service.token_text(int(t)): float(v)} for t, v in zip(new, new_logprobs)])
                    if request.logprobs is not None else None)
        if text or logprobs:
          yield piece(text, logprobs=logprobs)
        continue
      service.record("completions", head["id"], generation, pending.times,
                     pending.stream.request.sampling, request.model)
      final, rest = output.final(generation.tokens.tolist(), generation.finish_reason)
      yield piece(rest, final.finish_reason)
      options = request.stream_options
      if options is not None and options.include_usage:
        yield sse({**chunk, "choices": [], "usage": usage(generation)})
  except schema.APIError as error:
    yield sse(error.body())
  yield sse("[DONE]")


def create_app(service: Service) -> fastapi.FastAPI:
  """The ASGI app; `service.start()` must run before requests arrive."""
  app = fastapi.FastAPI(title="c2jax serve", docs_url=None, redoc_url=None)
  if service.api_key:
    app.add_middleware(auth.BearerAuth, api_key=service.api_key)

  @app.exception_handler(schema.APIError)
  async def _api_error(_, error: schema.APIError):
    return error_response(error)

  @app.exception_handler(HTTPException)
  async def _http_error(_, error: HTTPException):
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    return error_response(schema.APIError(error.status_code, str(error.detail), kind=kind))

  @app.exception_handler(EngineUnavailable)
  async def _engine_gone(_, error: EngineUnavailable):
    return error_response(schema.APIError(503, str(error), kind="server_error",
                                          code="engine_unavailable"))

  @app.exception_handler(Exception)
  async def _internal_error(_, error: Exception):
    logging.exception("request failed")
    return error_response(schema.APIError(500, f"internal error: {type(error).__name__}: "
                                          f"{error}", kind="server_error"))

  weights = (service.engine.resident_weights()
             if hasattr(service.engine, "resident_weights") else None)

  @app.get("/health")
  async def health():
    # weights: what the engine holds by tensor group (c2jax.rollout.resident).
    return {"status": "ok", "live_requests": service.loop.live, "weights": weights}

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [{
        "id": service.model_name, "object": "model", "created": service.created,
        "owned_by": "c2jax", "max_model_len": service.engine.max_length}]}

  add_routes(app, service)
  return app
