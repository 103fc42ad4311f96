"""Several choices per request, and /v1/completions' legacy log-probs, as clients read them.

    prompt: ["a", "b"], n: 2  ->  choices 0..3, index = prompt_index * n + j (OpenAI's order)

Every choice is its own engine request (continuous batching runs them together); with a
`seed`, choice j samples with seed + j, so the choices differ and the request is
reproducible. Non-streaming only: a streamed request asks for one choice.

Legacy `logprobs: N` (0..20), per choice: `tokens` (each token's text), `token_logprobs`,
`top_logprobs` (per token a {text: logprob} dict of the N most likely tokens plus the one
chosen, as OpenAI returns up to N + 1 entries) and `text_offset` (where each token's text
starts in the choice's text). With `echo` the prompt comes first, scored teacher-forced
under the plain distribution (temperature 1); its first token has no context, so its
logprob and top_logprobs are null, as OpenAI's are. Sampled tokens are reported under
the distribution they were sampled from (the request's temperature). `echo: true,
max_tokens: 0, logprobs: 1` scores the prompt without sampling: what evaluation harnesses
(lm-eval's log-likelihood requests) send.
"""

from __future__ import annotations

import asyncio
import dataclasses

import fastapi

from c2jax.rollout import Request, SamplingParams
from c2jax.serve import schema
from c2jax.serve.app import (MAX_TOP_LOGPROBS, ClientGone, Pending, Service, on_engine,
                             sampled_top_logprobs)
from c2jax.serve.output import Output

_POLL_S = 0.25


def choice_sampling(sampling: SamplingParams, choice: int) -> SamplingParams:
  if sampling.seed is None or choice == 0:
    return sampling
  return dataclasses.replace(sampling, seed=(sampling.seed + choice) % 2**32)


async def _until_done(pending: Pending):
  while True:
    event = await pending.next()
    if event[0] == "done":
      return event[1]


async def run_all(service: Service, endpoint: str, request_id: str,
                  engine_requests: list[Request], http: fastapi.Request, model: str):
  """Runs the requests together to the end and records each (token capture: one line per
  choice, id `<request id>:<index>` when there are several); their Generations, or None
  when the client went away (every request is cancelled and its slot freed)."""
  pendings = [Pending(service, r, stream=False) for r in engine_requests]
  tasks = [asyncio.ensure_future(_until_done(p)) for p in pendings]
  try:
    while True:
      done, _ = await asyncio.wait(tasks, timeout=_POLL_S,
                                   return_when=asyncio.FIRST_EXCEPTION)
      if any(t.exception() is not None for t in done):
        raise next(t.exception() for t in done if t.exception() is not None)
      if len(done) == len(tasks):
        break
      if await http.is_disconnected():
        raise ClientGone()
  except ClientGone:
    _cancel(tasks, pendings)
    return None
  except BaseException:
    _cancel(tasks, pendings)
    raise
  generations = [t.result() for t in tasks]
  for index, (pending, generation) in enumerate(zip(pendings, generations)):
    choice_id = request_id if len(pendings) == 1 else f"{request_id}:{index}"
    service.record(endpoint, choice_id, generation, pending.times,
                   pending.stream.request.sampling, model)
  return generations


def _cancel(tasks, pendings) -> None:
  for task in tasks:
    task.cancel()
  for pending in pendings:
    pending.cancel()


def _top_k(service: Service) -> int:
  # One compiled top-k for every request (each k would compile its own program).
  return min(MAX_TOP_LOGPROBS, service.vocab_size)


def _tops(service: Service, ids, values, count: int, chosen=None, chosen_logprob=None):
  """A legacy top_logprobs entry: the `count` most likely tokens' texts -> logprobs, plus
  the chosen token."""
  entry = {}
  for token, value in zip(ids[:count], values[:count]):
    entry.setdefault(service.token_text(int(token)), float(value))
  if chosen is not None:
    entry.setdefault(service.token_text(int(chosen)), float(chosen_logprob))
  return entry


async def _score_prompts(service: Service, prompts, count: int | None):
  """Per prompt: (logprobs with None first, top_logprobs entries with None first)."""
  k = _top_k(service)

  def work(engine):
    scored = []
    for ids in prompts:
      values = engine.logprobs([ids])[0]
      tops = engine.top_logprobs(ids, k, 1.0) if count else None
      scored.append((values, tops))
    return scored

  results = []
  for ids, (values, tops) in zip(prompts, await on_engine(service, work)):
    logprobs = [None] + [float(v) for v in values]
    entries = [None] + [_tops(service, tops[0][p - 1], tops[1][p - 1], count, ids[p],
                              values[p - 1]) if count else
                        _tops(service, (), (), 0, ids[p], values[p - 1])
                        for p in range(1, len(ids))]
    results.append((logprobs, entries))
  return results


async def _sampled_tops(service: Service, prompt, tokens, logprobs, count: int,
                        temperature: float) -> list[dict]:
  if not count or not len(tokens):
    return [_tops(service, (), (), 0, t, v) for t, v in zip(tokens, logprobs)]
  ids, values = await sampled_top_logprobs(service, prompt, tokens, temperature)
  return [_tops(service, ids[m], values[m], count, t, v)
          for m, (t, v) in enumerate(zip(tokens, logprobs))]


def legacy_logprobs(service: Service, tokens, logprobs, tops) -> dict:
  texts = [service.token_text(int(t)) for t in tokens]
  offsets, at = [], 0
  for text in texts:
    offsets.append(at)
    at += len(text)
  return {"tokens": texts,
          "token_logprobs": [None if x is None else float(x) for x in logprobs],
          "top_logprobs": tops, "text_offset": offsets}


async def respond(service: Service, request: schema.CompletionRequest, prompts, samplings,
                  http: fastapi.Request, head: dict):
  """The body of a non-streaming /v1/completions reply, or None if the client went away.
  `prompts`: (ids, echo start) per prompt; `samplings`: the SamplingParams per prompt."""
  n, count = request.n, request.logprobs
  generations = [None] * (len(prompts) * n)
  if request.max_tokens != 0:
    engine_requests = [Request(ids, choice_sampling(samplings[i], j))
                       for i, (ids, _) in enumerate(prompts) for j in range(n)]
    generations = await run_all(service, "completions", head["id"], engine_requests, http,
                                request.model)
    if generations is None:
      return None
  scored = (await _score_prompts(service, [ids for ids, _ in prompts], count)
            if request.echo and count is not None else None)
  choices, completion_tokens = [], 0
  for index, generation in enumerate(generations):
    i = index // n
    ids, start = prompts[i]
    tokens, logprobs, text, reason, tops = [], [], "", "length", []
    if generation is not None:
      output = Output(service.tokenizer.decode, stop_ids=(service.tokenizer.eos_id,),
                      stop_strings=samplings[i].stop_strings, tools=False, call_id_prefix="")
      final, _ = output.final(generation.tokens.tolist(), generation.finish_reason)
      tokens, logprobs = generation.tokens.tolist(), generation.logprobs.tolist()
      text, reason = final.content, final.finish_reason
      completion_tokens += len(tokens)
      if count is not None:
        tops = await _sampled_tops(service, ids, tokens, logprobs, count,
                                   samplings[i].temperature)
    if request.echo:
      # The echoed prompt leaves out the <|bos|> the server put before a text prompt.
      text = service.tokenizer.decode(ids[start:]) + text
      if scored is not None:
        prompt_logprobs, prompt_tops = scored[i]
        # The first echoed token is null even after a <|bos|>, as OpenAI's first is.
        logprobs = [None] + prompt_logprobs[start + 1:] + logprobs
        tops = [None] + prompt_tops[start + 1:] + tops
      tokens = ids[start:].tolist() + tokens
    choice = {"index": index, "text": text, "finish_reason": reason, "logprobs": None}
    if count is not None:
      choice["logprobs"] = legacy_logprobs(service, tokens, logprobs, tops)
    choices.append(choice)
  prompt_tokens = sum(len(ids) for ids, _ in prompts)
  return {**head, "object": "text_completion", "choices": choices,
          "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens}}
