"""The base-model evals of c2jax/eval/base as `scored` suites of `c2jax eval`.

  codebase_ppl    one record per file of a held-out repository (suite.args.repo): its NLL,
                  tokens and bytes under the rolling window (window, stride); score = the
                  file's bits per byte (lower is better). The suite's metrics pool them:
                  perplexity = exp(sum NLL / sum tokens), bits/byte, NLL per file. It
                  needs the model's logits, so only an engine policy (a c2jax run or HF
                  directory) can run it.
  state_tracking  one record per case (LoCoDiff-style: rebuild a file from its first
                  version and its diffs); score = 1 - Levenshtein / max length. Cases come
                  from a local git repository's history (suite.args.repo), a JSONL file
                  (suite.args.cases_path) or are generated (neither set). They are built
                  once into DIR/tasks/cases.jsonl, so a rerun scores the same cases.
                  Policies: engine (greedy on the JaxEngine), openai (greedy through the
                  endpoint's plain /v1/completions: base checkpoints get no chat template)
                  and oracle (answers the truth: checks diffs, prompts and scoring).

Both resume like agent suites: a case already in results.jsonl is not scored again.
"""

from __future__ import annotations

import collections
import math
import os
import time

import ml_collections
import numpy as np

from c2jax import config as configlib
from c2jax.eval.base import codebase as codebase_lib
from c2jax.eval.base import perplexity as perplexity_lib
from c2jax.eval.base import state_cases
from c2jax.eval.base import state_tracking as tracking

CASES_FILE = "cases.jsonl"


# ---- codebase perplexity ----------------------------------------------------------------
def codebase_ppl_defaults() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      repo="", window=1024, stride=512, batch_size=8, extensions=(),
      max_file_bytes=1 << 20))


def _check_dir(cfg, key: str, what: str) -> None:
  value = configlib.get(cfg, key)
  if value and not os.path.isdir(os.path.expanduser(value)):
    raise configlib.ConfigError(key, f"= {value!r} is not a directory; {what}.")


def check_codebase_ppl(cfg) -> None:
  """The suite's arguments, before any model is loaded (cfg: the whole eval config)."""
  if not cfg.suite.args.repo:
    raise configlib.ConfigError("suite.args.repo", "is empty; set it to the root of the "
                                "held-out repository whose files are scored.")
  _check_dir(cfg, "suite.args.repo", "pass the held-out repository's root")
  configlib.check_positive(cfg, "suite.args.batch_size")
  configlib.check_positive(cfg, "suite.args.max_file_bytes")
  window, stride = cfg.suite.args.window, cfg.suite.args.stride
  if not (isinstance(window, int) and isinstance(stride, int) and 1 <= stride < window):
    raise configlib.ConfigError("suite.args.stride", f"= {stride} with window = {window}; "
                                "use integers 1 <= stride < window (window - stride is the "
                                "least left context a scored token sees).")


def _engine_parts(policy, suite: str):
  if not all(hasattr(policy, k) for k in ("model_cfg", "params", "tokenizer")):
    raise ValueError(f"suite {suite!r} needs the model itself (config.policy.kind='engine' "
                     f"with policy.run = a c2jax run or HF directory); got policy "
                     f"{type(policy).__name__}.")
  return policy.model_cfg, policy.params, policy.tokenizer


def codebase_ppl(args, policy, out_dir, done):
  """Every file's NLL in one rolling-window pass; files already recorded are skipped (a
  partly recorded repository is scored again and only its missing files appended)."""
  model_cfg, params, tokenizer = _engine_parts(policy, "codebase_ppl")
  options = codebase_lib.CodebaseOptions(extensions=tuple(args.extensions),
                                         max_file_bytes=args.max_file_bytes)
  found = codebase_lib.collect(args.repo, options)
  if all(f.path in done for f in found.files):
    return
  stream = codebase_lib.tokenize(found, tokenizer, options)
  window = min(args.window, len(stream.ids))
  stride = min(args.stride, window - 1)
  scorer = perplexity_lib.WindowScorer(model_cfg, params, window=window,
                                       batch_size=args.batch_size)
  result = perplexity_lib.score_stream(scorer, stream, stride, found.skipped)
  scoring = {"tokens": result.tokens, "seconds": round(result.seconds, 4),
             "windows": result.windows, "window": window, "stride": stride,
             "skipped_files": dict(found.skipped)}
  for f in result.files:
    if f.path in done:
      continue
    bits_per_byte = f.nll / math.log(2) / f.bytes
    yield {"task_id": f.path, "score": bits_per_byte, "nll": f.nll, "tokens": f.tokens,
           "bytes": f.bytes, "bits_per_byte": bits_per_byte, "repo": os.fspath(args.repo),
           "scoring": scoring}


def codebase_ppl_metrics(records: list[dict]) -> dict:
  """Pooled over files: perplexity, bits/byte, NLL per token, NLL per file; the rate of
  the scoring passes (first-window compilation included)."""
  files = sorted((r for r in records if not r.get("infra_error")), key=lambda r: r["task_id"])
  if not files:
    return {}
  nll = sum(r["nll"] for r in files)
  tokens = sum(r["tokens"] for r in files)
  num_bytes = sum(r["bytes"] for r in files)
  passes = {(p["seconds"], p["tokens"]) for p in (r["scoring"] for r in files)}
  seconds = sum(s for s, _ in passes)
  per_token = nll / max(tokens, 1)
  return {"files": len(files), "tokens": tokens, "bytes": num_bytes, "nll": nll,
          "nll_per_token": per_token, "perplexity": math.exp(min(per_token, 700.0)),
          "bits_per_byte": nll / math.log(2) / max(num_bytes, 1),
          "window": files[0]["scoring"]["window"], "stride": files[0]["scoring"]["stride"],
          "tokens_per_second": sum(t for _, t in passes) / seconds if seconds else None,
          "per_file": {r["task_id"]: {"nll": r["nll"], "tokens": r["tokens"],
                                      "bits_per_byte": r["bits_per_byte"]} for r in files}}


# ---- state tracking ---------------------------------------------------------------------
def state_tracking_defaults() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      repo="", cases_path="", count=16, seed=0, min_diffs=2, max_diffs=8,
      max_chars=24_000, procedural_diffs=(2, 6), procedural_functions=(2, 5),
      max_new_tokens_factor=1.5, max_new_tokens_slack=32, max_new_tokens=4096, chunk=0))


def check_state_tracking(cfg) -> None:
  """The suite's arguments, before any model is loaded (cfg: the whole eval config)."""
  args = cfg.suite.args
  if args.repo and args.cases_path:
    raise configlib.ConfigError("suite.args.repo", "and suite.args.cases_path are both set; "
                                "cases come from one: a git repository or a cases JSONL.")
  _check_dir(cfg, "suite.args.repo", "pass a local git repository (or leave it empty for "
             "generated cases)")
  if args.cases_path and not os.path.isfile(os.path.expanduser(args.cases_path)):
    raise configlib.ConfigError("suite.args.cases_path", f"= {args.cases_path!r} is not a "
                                "file; write one with tools/tasks/build_state_tracking.py.")
  for key in ("count", "max_new_tokens", "max_new_tokens_factor", "min_diffs"):
    configlib.check_positive(cfg, f"suite.args.{key}")
  configlib.check_positive(cfg, "suite.args.chunk", allow_zero=True)
  configlib.check_positive(cfg, "suite.args.max_new_tokens_slack", allow_zero=True)
  if args.max_diffs < args.min_diffs:
    raise configlib.ConfigError("suite.args.max_diffs", f"= {args.max_diffs} is below "
                                f"suite.args.min_diffs = {args.min_diffs}.")
  for key in ("procedural_diffs", "procedural_functions"):
    low_high = tuple(args[key])
    if len(low_high) != 2 or not 1 <= low_high[0] <= low_high[1]:
      raise configlib.ConfigError(f"suite.args.{key}", f"= {low_high}; use an inclusive "
                                  "range (low, high) with 1 <= low <= high.")


def _cases(args, out_dir) -> list[state_cases.Case]:
  listing = os.path.join(out_dir, CASES_FILE)
  if os.path.exists(listing):
    return state_cases.load_jsonl(listing)
  if args.cases_path:
    cases = state_cases.load_jsonl(args.cases_path)[:args.count]
  elif args.repo:
    cases = state_cases.git_cases(args.repo, max_cases=args.count, min_diffs=args.min_diffs,
                                  max_diffs=args.max_diffs, max_chars=args.max_chars)
  else:
    cases = state_cases.procedural_cases(args.count, seed=args.seed,
                                         num_diffs=tuple(args.procedural_diffs),
                                         num_functions=tuple(args.procedural_functions))
  if not cases:
    raise ValueError(f"suite state_tracking built no cases from config.suite.args = "
                     f"{args.to_dict()}; pick a repository with longer file histories "
                     "(or lower min_diffs), or leave repo empty for generated cases.")
  state_cases.save_jsonl(cases, listing + ".tmp")
  os.replace(listing + ".tmp", listing)
  return cases


def _record(case, result: tracking.CaseResult, wall_s: float) -> dict:
  return {"task_id": case.id, "score": result.score, "exact": result.exact,
          "solved": result.exact, "source": case.source, "path": case.path,
          "diffs": len(case.diffs), "prompt_tokens": result.prompt_tokens,
          "completion_tokens": result.completion_tokens,
          "finish_reason": result.finish_reason, "wall_s": round(wall_s, 4),
          "answer": result.answer[:2000]}


def _skipped(case_id: str, max_length: int) -> dict:
  # An infra error: excluded from the scores, listed apart, retried by a rerun (with a
  # larger policy.max_length, which a resumed run may change).
  return {"task_id": case_id, "score": None, "infra_error":
          f"prompt + answer do not fit policy.max_length = {max_length}; raise it to score "
          "this case"}


def state_tracking(args, policy, out_dir, done):
  """Cases not yet in results.jsonl, `chunk` at a time (0: policy.slots for an engine,
  policy.concurrency otherwise), each chunk's records yielded as it ends."""
  options = tracking.StateTrackingOptions(
      max_new_tokens_factor=args.max_new_tokens_factor,
      max_new_tokens_slack=args.max_new_tokens_slack, max_new_tokens_cap=args.max_new_tokens)
  options.validate()
  todo = [c for c in _cases(args, out_dir) if c.id not in done]
  generate, width = _generator(policy, options)
  width = args.chunk or width
  for first in range(0, len(todo), width):
    yield from generate(todo[first:first + width])


def _generator(policy, options):
  from c2jax.eval import engine_policy, openai_policy, oracle  # pylint: disable=g-import-not-at-top

  if isinstance(policy, engine_policy.EnginePolicy):
    return (lambda chunk: _engine_chunk(policy, options, chunk)), policy.engine.num_slots
  if isinstance(policy, openai_policy.OpenAIPolicy):
    return ((lambda chunk: _endpoint_chunk(policy, options, chunk)),
            policy.cfg.concurrency)
  if isinstance(policy, oracle.OraclePolicy):
    return (lambda chunk: [_record(c, tracking.CaseResult(
        c.id, tracking.score_answer(c.final, c.final), True, 0, 0, "oracle", c.final), 0.0)
                           for c in chunk]), 64
  raise ValueError(f"suite state_tracking cannot run policy {type(policy).__name__}.")


def _engine_chunk(policy, options, chunk):
  engine, tokenizer = policy.engine, policy.tokenizer
  began = time.perf_counter()
  requests, kept, skipped = tracking.prepare(engine.max_length, tokenizer, chunk, options)
  out = [_skipped(case_id, engine.max_length) for case_id in skipped]
  if kept:
    results = tracking.score_generations(tokenizer, kept, engine.generate(requests), options)
    wall = (time.perf_counter() - began) / len(kept)
    out += [_record(c, r, wall) for c, r in zip(kept, results)]
  return out


def _endpoint_chunk(policy, options, chunk):
  """Greedy plain-text completions, one request per case, `concurrency` in flight. The
  budget: the truth's UTF-8 bytes (an upper bound on its tokens under any byte-level
  tokenizer) in place of its token count (options.budget)."""
  import concurrent.futures  # pylint: disable=g-import-not-at-top

  def one(case):
    began = time.perf_counter()
    budget = options.budget(len(case.final.encode("utf-8")))
    completion = policy.complete_text(tracking.render_prompt(case, options),
                                      max_tokens=max(1, budget),
                                      stop=list(options.stop_strings))
    if completion.get("infra_error"):
      return {"task_id": case.id, "score": None, "infra_error": completion["infra_error"]}
    answer = tracking.extract_answer(completion["text"], options.opens_block)
    result = tracking.CaseResult(case.id, tracking.score_answer(answer, case.final),
                                 answer == case.final, completion["prompt_tokens"],
                                 completion["completion_tokens"],
                                 completion["finish_reason"], answer)
    return _record(case, result, time.perf_counter() - began)

  with concurrent.futures.ThreadPoolExecutor(policy.cfg.concurrency) as pool:
    return list(pool.map(one, chunk))


def state_tracking_metrics(records: list[dict]) -> dict:
  """Mean normalised character similarity (1 - mean normalised distance), exact match,
  the clustered standard error, and both per prompt-length bucket (powers of 2 tokens)."""
  cases = [r for r in records if not r.get("infra_error")]
  skipped = [r for r in records if r.get("infra_error")]
  if not cases:
    return {"cases": 0, "skipped": len(skipped)}
  scores = np.asarray([r["score"] for r in cases], np.float64)
  buckets = collections.defaultdict(list)
  for r in cases:
    buckets[1 << max(0, (r.get("prompt_tokens") or 0) - 1).bit_length()].append(r)
  return {"cases": len(cases), "skipped": len(skipped),
          "mean_score": float(scores.mean()),
          "mean_normalised_distance": float(1.0 - scores.mean()),
          "stderr": float(scores.std(ddof=1) / math.sqrt(len(scores))) if len(scores) > 1
          else 0.0,
          "exact_match": float(np.mean([bool(r["exact"]) for r in cases])),
          "completion_tokens": int(sum(r.get("completion_tokens") or 0 for r in cases)),
          "by_prompt_length": {
              f"<={upper}": {"cases": len(group),
                             "mean_score": float(np.mean([r["score"] for r in group])),
                             "exact_match": float(np.mean([bool(r["exact"]) for r in group]))}
              for upper, group in sorted(buckets.items())}}
