"""Throughput of the base-model evals (c2jax.eval.base) on this machine, random weights.

    python -m tools.bench.base_evals --variants tiny,small
    python -m tools.bench.base_evals --state_variants tiny --cases 16

Codebase perplexity: the files of --repo (default: this checkout's c2jax/ package) are
tokenised with a byte-level BPE trained on them (--vocab tokens) and the first
--max_tokens are scored with window W and stride S; tokens/s counts scored tokens in a
second pass (the first compiles). State tracking: --cases procedural cases, greedy
generation with JaxEngine (--slots slots), cases/s over the whole run after a warm-up
case (random weights never close the fence, so each case writes its full budget of
1.5 x the answer's tokens + 32: an upper bound on the cost per case).
Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time


def _tokenizer(repo: pathlib.Path, vocab: int):
  from c2jax.data import tokenizer as tokenizer_lib
  from c2jax.eval.base import codebase
  texts = [f.text for f in codebase.collect(repo).files]
  return tokenizer_lib.train_bpe(texts, vocab)


def _params(cfg):
  import jax

  from c2jax import model
  return jax.jit(lambda key: model.init(cfg, key))(jax.random.key(0))


def bench_perplexity(name: str, args, tokenizer) -> dict:
  from c2jax.eval.base import codebase, perplexity
  from c2jax.model import variants
  cfg = variants.get(name)
  scorer = perplexity.WindowScorer(cfg, _params(cfg), window=args.window,
                                   batch_size=args.batch)
  stream = codebase.tokenize(codebase.collect(args.repo), tokenizer)
  ids = stream.ids[:args.max_tokens]
  began = time.perf_counter()
  scorer.token_nll(ids, args.stride)
  first = time.perf_counter() - began
  began = time.perf_counter()
  nll, windows = scorer.token_nll(ids, args.stride)
  seconds = time.perf_counter() - began
  return {"eval": "codebase_perplexity", "variant": name, "window": args.window,
          "stride": args.stride, "batch": args.batch, "tokens": len(ids) - 1,
          "windows": windows, "seconds": round(seconds, 2),
          "tokens_per_s": round((len(ids) - 1) / seconds, 1),
          "first_pass_s": round(first, 2), "nll_per_token": round(nll.sum() / (len(ids) - 1), 3),
          "load_avg_1m": round(os.getloadavg()[0], 1)}


def bench_state_tracking(name: str, args, tokenizer) -> dict:
  from c2jax.eval.base import state_cases, state_tracking
  from c2jax.model import variants
  from c2jax.rollout import JaxEngine
  cfg = variants.get(name)
  engine = JaxEngine(cfg, _params(cfg), num_slots=args.slots, max_length=args.max_length,
                     detokenize=tokenizer.decode)
  cases = state_cases.procedural_cases(args.cases + 2, seed=args.seed)
  state_tracking.run(engine, tokenizer, cases[:2])  # compiles prefill buckets and decode
  result = state_tracking.run(engine, tokenizer, cases[2:])
  summary = result.summary()
  prompt = sum(c.prompt_tokens for c in result.cases) / len(result.cases)
  return {"eval": "state_tracking", "variant": name, "slots": args.slots,
          "cases": summary["cases"], "skipped": summary["skipped"],
          "mean_prompt_tokens": round(prompt, 1),
          "completion_tokens": summary["completion_tokens"],
          "seconds": round(summary["seconds"], 2),
          "cases_per_s": round(summary["cases_per_second"], 3),
          "mean_score": round(summary["mean_score"], 3),
          "load_avg_1m": round(os.getloadavg()[0], 1)}


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  here = pathlib.Path(__file__).resolve().parents[2]
  parser.add_argument("--repo", type=pathlib.Path, default=here / "c2jax")
  parser.add_argument("--vocab", type=int, default=4096)
  parser.add_argument("--variants", default="tiny,small", help="for perplexity")
  parser.add_argument("--window", type=int, default=256)
  parser.add_argument("--stride", type=int, default=128)
  parser.add_argument("--batch", type=int, default=8, help="windows per scoring call")
  parser.add_argument("--max_tokens", type=int, default=8192)
  parser.add_argument("--state_variants", default="tiny", help="for state tracking ('' skips)")
  parser.add_argument("--cases", type=int, default=16)
  parser.add_argument("--slots", type=int, default=8)
  parser.add_argument("--max_length", type=int, default=4096)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  tokenizer = _tokenizer(args.repo, args.vocab)
  rows = []
  for name in filter(None, args.variants.split(",")):
    rows.append(bench_perplexity(name, args, tokenizer))
    print(json.dumps(rows[-1]), flush=True)
  for name in filter(None, args.state_variants.split(",")):
    rows.append(bench_state_tracking(name, args, tokenizer))
    print(json.dumps(rows[-1]), flush=True)
  return rows


if __name__ == "__main__":
  main()
