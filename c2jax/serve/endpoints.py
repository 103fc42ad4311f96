"""POST /v1/chat/completions and /v1/completions (plain and `stream=true`)."""

from __future__ import annotations

import time

import fastapi
from fastapi import responses
from starlette.concurrency import run_in_threadpool

from c2jax.rollout import Request
from c2jax.serve import prompts, schema, validation
from c2jax.serve.app import (ClientGone, Pending, Service, alternatives, logprob_entries,
                             new_id, read_json, score, sse, usage)
from c2jax.serve.output import Output


def _chat_setup(service: Service, payload):
  request = schema.parse(schema.ChatRequest, payload)
  request.check_n()
  service.check_model(request)
  if request.top_logprobs:
    if not hasattr(service.engine, "top_logprobs"):
      raise schema.APIError(400, "top_logprobs: this engine reports the sampled token's "
                            "logprob only; leave top_logprobs unset.", "top_logprobs")
    if request.stream or not request.logprobs:
      raise schema.APIError(400, "top_logprobs needs logprobs = true and is not "
                            "available with stream = true.", "top_logprobs")
  validation.check_tool_schemas(request.tools)
  specs = prompts.tool_specs(request)
  texts = [message.text(i) for i, message in enumerate(request.messages)]
  texts += [tool.function.description for tool in request.tools or ()]
  validation.check_text_length(service.tokenizer, service.engine.max_length, texts,
                               "messages")
  prompt = prompts.chat_prompt(service.tokenizer, request, specs, service.turns)
  specials = service.tokenizer.specials
  stop_ids = (service.tokenizer.token_id(specials.end), service.tokenizer.eos_id)
  sampling = service.sampling(request, request.limit(), len(prompt), stop_ids)
  return request, specs, prompt, sampling


def _completion_setup(service: Service, payload):
  request = schema.parse(schema.CompletionRequest, payload)
  request.check_n()
  service.check_model(request)
  unsupported = {"echo": request.echo and request.stream,
                 "suffix": request.suffix is not None,
                 "best_of": request.best_of not in (None, 1)}
  for name, used in unsupported.items():
    if used:
      raise schema.APIError(400, f"{name} = {getattr(request, name)!r} is not supported "
                            "by this server.", name)
  if request.logprobs:
    raise schema.APIError(400, f"logprobs = {request.logprobs}: this server reports the "
                          "sampled token's logprob only (no alternatives); send logprobs=0.",
                          "logprobs")
  if request.max_tokens == 0 and not request.echo:
    raise schema.APIError(400, "max_tokens = 0 asks for nothing; it is allowed only with "
                          "echo = true (scoring the prompt).", "max_tokens")
  if isinstance(request.prompt, str) or (request.prompt and isinstance(request.prompt[0], str)):
    texts = [request.prompt] if isinstance(request.prompt, str) else request.prompt
    validation.check_text_length(service.tokenizer, service.engine.max_length, texts,
                                 "prompt")
  prompt, echo_start = prompts.completion_prompt(service.tokenizer, service.vocab_size,
                                                 request)
  sampling = service.sampling(request, request.max_tokens or None, len(prompt),
                              (service.tokenizer.eos_id,))
  return request, prompt, echo_start, sampling


async def _finish(pending: Pending, http: fastapi.Request):
  """Waits for the Generation of a non-streaming request (cancelling it if the client
  goes away)."""
  try:
    while True:
      event = await pending.next(http)
      if event[0] == "done":
        return event[1]
  except BaseException:
    pending.cancel()
    raise


async def _generate(service: Service, endpoint: str, request_id: str, engine_request,
                    http: fastapi.Request, model_name):
  """Runs a non-streaming request to the end and records it (token capture); the
  Generation, or None when the client went away (its slot is freed)."""
  pending = Pending(service, engine_request, stream=False)
  try:
    generation = await _finish(pending, http)
  except ClientGone:
    return None
  service.record(endpoint, request_id, generation, pending.times,
                 engine_request.sampling, model_name)
  return generation


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
    generation = await _generate(service, "chat.completions", request_id,
                                 Request(prompt, sampling), http, request.model)
    if generation is None:
      return responses.Response(status_code=499)
    final, _ = output.final(generation.tokens.tolist(), generation.finish_reason)
    service.remember_turn(final, generation)
    message = {"role": "assistant",
               "content": final.content if (final.content or not final.tool_calls) else None}
    if final.tool_calls:
      message["tool_calls"] = final.tool_calls
    choice = {"index": 0, "message": message, "finish_reason": final.finish_reason,
              "logprobs": None}
    if final.call_errors:
      choice["c2jax_tool_call_errors"] = final.call_errors
    if request.logprobs:
      entries = logprob_entries(service, generation.tokens, generation.logprobs)
      if request.top_logprobs:
        tops = await alternatives(service, generation.prompt_tokens, generation.tokens,
                                  request.top_logprobs, sampling.temperature)
        for entry, top in zip(entries, tops):
          entry["top_logprobs"] = top
      choice["logprobs"] = {"content": entries}
    return {**head, "object": "chat.completion", "choices": [choice],
            "usage": usage(generation)}

  @app.post("/v1/completions")
  async def completions(http: fastapi.Request):
    request, prompt, echo_start, sampling = await run_in_threadpool(
        _completion_setup, service, await read_json(http, service.limits))
    request_id = new_id("cmpl")
    output = Output(service.tokenizer.decode, stop_ids=sampling.stop_tokens,
                    stop_strings=sampling.stop_strings, tools=False, call_id_prefix="")
    head = _head(service, request_id)
    if request.stream:
      return responses.StreamingResponse(
          _completion_stream(service, request, Request(prompt, sampling), output, head),
          media_type="text/event-stream")
    if request.max_tokens == 0:  # echo only: score the prompt, sample nothing
      tokens, logprobs, text, reason = [], [], "", "length"
      counts = {"prompt_tokens": len(prompt), "completion_tokens": 0,
                "total_tokens": len(prompt)}
    else:
      generation = await _generate(service, "completions", request_id,
                                   Request(prompt, sampling), http, request.model)
      if generation is None:
        return responses.Response(status_code=499)
      final, _ = output.final(generation.tokens.tolist(), generation.finish_reason)
      tokens, logprobs = generation.tokens.tolist(), generation.logprobs.tolist()
      text, reason, counts = final.content, final.finish_reason, usage(generation)
    if request.echo:
      # The echoed prompt leaves out the <|bos|> the server put before a text prompt.
      scored = [None] + (await score(service, prompt) if request.logprobs is not None
                         else [None] * (len(prompt) - 1))
      text = service.tokenizer.decode(prompt[echo_start:]) + text
      tokens, logprobs = prompt[echo_start:].tolist() + tokens, scored[echo_start:] + logprobs
    choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
    if request.logprobs is not None:
      choice["logprobs"] = _completion_logprobs(service, tokens, logprobs)
    return {**head, "object": "text_completion", "choices": [choice], "usage": counts}


def _completion_logprobs(service: Service, tokens, logprobs) -> dict:
  texts = [service.token_text(int(t)) for t in tokens]
  offsets, at = [], 0
  for text in texts:
    offsets.append(at)
    at += len(text)
  return {"tokens": texts,
          "token_logprobs": [None if x is None else float(x) for x in logprobs],
          "top_logprobs": None, "text_offset": offsets}


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
        logprobs = (_completion_logprobs(service, new, new_logprobs)
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
