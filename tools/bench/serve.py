"""Serving throughput of `c2jax serve` against its own engine.

    python -m tools.bench.serve                  # tiny, 8 clients
    python -m tools.bench.serve --stream --max_tokens 256
    python -m tools.bench.serve --smoke          # seconds; for tests

One JaxEngine with `--clients` slots (random `--variant` weights) is measured twice in
the same process:
  engine  batch decode rate: `--clients` requests run at once to max_tokens, none
          stopping early (a full batch every step); tokens sampled after the prefills /
          decode time, the time of one-token requests subtracted (decode.py's
          steady-state number);
  server  the same engine behind the HTTP server; `--clients` threads each send
          `--rounds` /v1/completions requests in a row through the official openai
          client; completion tokens (from `usage`) / wall time from the first request
          to the last response, so prefill, HTTP, JSON and scheduling all count.
The ratio of the medians over --repeats interleaved pairs, server / engine, is the
serving overhead (the goal is >= 0.8). Requests sample
at temperature 1 with a seed per request; server requests stop at max_tokens or <|eos|>.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import statistics
import sys
import time


def _setup(args):
  import jax
  import numpy as np

  from c2jax import model
  from c2jax.data import tokenizer as tokenizer_lib
  from c2jax.model import variants
  from c2jax.rollout import JaxEngine

  cfg = variants.get(args.variant)
  texts = [f"def f{i}(x):\n    return x * {i} + len('{'ab' * i}')\n" for i in range(200)]
  tokenizer = tokenizer_lib.train_bpe(texts, min(cfg.vocab_size, 300))
  params = jax.jit(lambda key: model.init(cfg, key))(jax.random.key(0))
  rng = np.random.default_rng(0)
  prompts = [rng.integers(20, tokenizer.vocab_size, args.prompt_len).tolist()
             for _ in range(args.clients * args.rounds)]
  engine = JaxEngine(cfg, params, num_slots=args.clients,
                     max_length=args.prompt_len + args.max_tokens + 1,
                     prefill_buckets=(args.prompt_len,), detokenize=tokenizer.decode)
  return cfg, tokenizer, engine, prompts


def _engine_rate(engine, prompts, args) -> float:
  from c2jax.rollout import Request, SamplingParams

  def sampling(seed):
    # No stop token: every slot decodes all max_tokens, so each step is a full batch
    # (the server's requests may stop early at <|eos|>, which its rate has to absorb).
    return SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=seed)

  batch = prompts[:args.clients]

  def timed(count):
    requests = [Request(p, dataclasses.replace(sampling(i), max_tokens=count))
                for i, p in enumerate(batch)]
    start = time.perf_counter()
    engine.generate(requests)
    return time.perf_counter() - start

  timed(2)  # compile prefill and decode
  # Prefill cancels in the difference (an engine call may run several decode steps, so
  # the tokens of the call that admits the batch cannot be split off its time); the
  # fastest of three runs each keeps a busy machine's noise out of the difference.
  full, one = (min(timed(count) for _ in range(3)) for count in (args.max_tokens, 1))
  if full <= one:
    raise RuntimeError(f"engine timing: {args.max_tokens} tokens took no longer than 1 (best "
                       "of 3); the machine is too busy to time this, or raise --max_tokens.")
  return len(batch) * (args.max_tokens - 1) / (full - one)


def _server_rate(engine, tokenizer, prompts, args) -> tuple[float, int]:
  import openai

  from c2jax.serve import Running, Service

  service = Service(engine, tokenizer, "bench", vocab_size=engine.cfg.vocab_size)
  with Running(service) as running:
    client = openai.OpenAI(base_url=running.base_url, api_key="none", max_retries=0,
                           timeout=600)

    def one(index):
      kwargs = dict(model="bench", prompt=prompts[index], max_tokens=args.max_tokens,
                    temperature=1.0, seed=index)
      if not args.stream:
        return client.completions.create(**kwargs).usage.completion_tokens
      chunks = client.completions.create(**kwargs, stream=True,
                                         stream_options={"include_usage": True})
      return [c for c in chunks][-1].usage.completion_tokens

    one(0)  # warm the HTTP path
    def client_loop(c):
      return sum(one(c * args.rounds + r) for r in range(args.rounds))

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
      tokens = sum(pool.map(client_loop, range(args.clients)))
    elapsed = time.perf_counter() - start
  return tokens / elapsed, tokens


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--variant", default="tiny")
  parser.add_argument("--clients", type=int, default=8)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--prompt_len", type=int, default=64)
  parser.add_argument("--max_tokens", type=int, default=128)
  parser.add_argument("--stream", action="store_true")
  parser.add_argument("--repeats", type=int, default=3,
                      help="interleaved engine / server measurements; medians reported")
  parser.add_argument("--smoke", action="store_true",
                      help="a few tokens per request: checks the benchmark runs")
  args = parser.parse_args(argv)
  if args.smoke:
    # 16 tokens: the engine rate is a difference of two timings, and 7 decode steps
    # (~1 ms at tiny) could come out negative under a loaded test run.
    args.rounds, args.prompt_len, args.max_tokens, args.repeats = 1, 16, 16, 1
  cfg, tokenizer, engine, prompts = _setup(args)
  engine_rates, server_rates = [], []
  for _ in range(args.repeats):  # interleaved, so load from other processes hits both
    engine_rates.append(_engine_rate(engine, prompts, args))
    rate, tokens = _server_rate(engine, tokenizer, prompts, args)
    server_rates.append(rate)
  engine_rate, server_rate = statistics.median(engine_rates), statistics.median(server_rates)
  result = {"variant": args.variant, "clients": args.clients, "rounds": args.rounds,
            "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
            "stream": args.stream, "server_tokens": tokens,
            "engine_tokens_per_s": round(engine_rate, 1),
            "server_tokens_per_s": round(server_rate, 1),
            "ratio": float(f"{server_rate / engine_rate:.3g}"), "params": cfg.name,
            "engine_runs": [round(r, 1) for r in engine_rates],
            "server_runs": [round(r, 1) for r in server_rates]}
  print(json.dumps(result), flush=True)
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
