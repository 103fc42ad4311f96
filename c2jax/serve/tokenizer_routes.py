"""POST /tokenize and /detokenize, in vLLM's request and response shapes, so clients need
no exported tokenizer to count or build prompts.

    POST /tokenize   {"prompt": "def f", "add_special_tokens": true}
                  -> {"count": 3, "max_model_len": 2048, "tokens": [1, 87, 301],
                      "token_strs": null}
    POST /tokenize   {"messages": [...], "tools": [...]}   (the chat prompt, as served)
    POST /detokenize {"tokens": [87, 301]} -> {"prompt": "def f"}

The ids are exactly those /v1/completions (a string prompt gets the server's <|bos|>
first unless add_special_tokens is false) and /v1/chat/completions would feed the model.
`model` is optional; when sent it must name the served model. `return_token_strs: true`
adds each token's text.
"""

from __future__ import annotations

import fastapi
from starlette.concurrency import run_in_threadpool

from c2jax.serve import schema, validation
from c2jax.serve.app import Service, checked_chat_prompt, read_json


class _TokenizeText(schema.Body):
  model: str | None = None
  prompt: str
  add_special_tokens: bool = True
  return_token_strs: bool = False


class _TokenizeChat(schema.ChatRequest):
  model: str | None = None
  add_generation_prompt: bool = True
  return_token_strs: bool = False


class _Detokenize(schema.Body):
  model: str | None = None
  tokens: list[int]


def _check_model(service: Service, request) -> None:
  if request.model is not None:
    service.check_model(request)


def tokenize(service: Service, payload) -> dict:
  chat = isinstance(payload, dict) and "messages" in payload
  request = schema.parse(_TokenizeChat if chat else _TokenizeText, payload)
  _check_model(service, request)
  max_length = service.engine.max_length
  if chat:
    if not request.add_generation_prompt:
      raise schema.APIError(400, "add_generation_prompt = false is not supported: the "
                            "chat prompt ends in the assistant marker, as served.",
                            "add_generation_prompt")
    ids = checked_chat_prompt(service, request)[1].tolist()
  else:
    validation.check_text_length(service.tokenizer, max_length, [request.prompt], "prompt")
    ids = service.tokenizer.encode(request.prompt).tolist()
    if request.add_special_tokens:
      ids = [service.tokenizer.bos_id] + ids
  return {"count": len(ids), "max_model_len": max_length, "tokens": ids,
          "token_strs": ([service.token_text(t) for t in ids] if request.return_token_strs
                         else None)}


def detokenize(service: Service, payload) -> dict:
  request = schema.parse(_Detokenize, payload)
  _check_model(service, request)
  bad = [t for t in request.tokens if not 0 <= t < service.tokenizer.vocab_size]
  if bad:
    raise schema.APIError(400, f"token id {bad[0]} is outside the tokenizer's vocabulary "
                          f"[0, {service.tokenizer.vocab_size}).", "tokens")
  return {"prompt": service.tokenizer.decode(request.tokens)}


def add_routes(app: fastapi.FastAPI, service: Service) -> None:

  @app.post("/tokenize")
  async def tokenize_route(http: fastapi.Request):
    return await run_in_threadpool(tokenize, service, await read_json(http, service.limits))

  @app.post("/detokenize")
  async def detokenize_route(http: fastapi.Request):
    return await run_in_threadpool(detokenize, service,
                                   await read_json(http, service.limits))

