"""Base-model evaluations of the Composer 2 report (App. B), as pure functions.

  codebase_perplexity(cfg, params, tokenizer, repo_dir, window=W, stride=S)
      NLL of a held-out repository's files, concatenated alphabetically, under a rolling
      window: total NLL, tokens, bits per byte, perplexity, per-file NLL.
"""

from c2jax.eval.base.codebase import CodebaseOptions
from c2jax.eval.base.perplexity import PerplexityResult, WindowScorer, codebase_perplexity

__all__ = ["CodebaseOptions", "PerplexityResult", "WindowScorer", "codebase_perplexity"]
