"""Base-model evaluations of the Composer 2 report (App. B), as pure, composable functions.

  run = load_run(RUN_DIR)         # model config, newest params, tokenizer (train.run_loading)

  codebase_perplexity(run.cfg, run.params, run.tokenizer, REPO_DIR, window=W, stride=S)
      NLL of a held-out repository's files, concatenated in alphabetical order of path,
      under a rolling window (every token scored once, >= W - S tokens of context):
      total NLL, tokens, bits per byte, perplexity, per-file NLL.  -> PerplexityResult

  cases = git_cases(REPO_DIR) or procedural_cases(N, seed=0)   # or load_jsonl(PATH)
  engine = JaxEngine(run.cfg, run.params, num_slots=8, max_length=8192,
                     detokenize=run.tokenizer.decode)
  run_state_tracking(engine, run.tokenizer, cases)
      LoCoDiff-style: rebuild a file from its first version and a sequence of unified
      diffs; greedy generation; score = mean of 1 - Levenshtein / max length (characters).
      -> StateTrackingResult

`python -m tools.tasks.build_state_tracking --repo DIR --out cases.jsonl` writes cases.
"""

from c2jax.eval.base.codebase import CodebaseOptions
from c2jax.eval.base.perplexity import PerplexityResult, WindowScorer, codebase_perplexity
from c2jax.eval.base.state_cases import Case, git_cases, load_jsonl, procedural_cases, save_jsonl
from c2jax.eval.base.state_tracking import (StateTrackingOptions, StateTrackingResult,
                                            extract_answer)
from c2jax.eval.base.state_tracking import run as run_state_tracking
from c2jax.train.run_loading import LoadedRun, load_run

__all__ = ["Case", "CodebaseOptions", "LoadedRun", "PerplexityResult", "StateTrackingOptions",
           "StateTrackingResult", "WindowScorer", "codebase_perplexity", "extract_answer",
           "git_cases", "load_jsonl", "load_run", "procedural_cases", "save_jsonl",
           "run_state_tracking"]
