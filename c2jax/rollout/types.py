"""What goes into an engine (Request, SamplingParams) and what comes out (Generation)."""

from __future__ import annotations

import dataclasses

import numpy as np

FINISH_REASONS = ("stop_token", "stop_string", "max_tokens", "length")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How one request samples and when it stops.

  temperature 0 is greedy (argmax). top_k 0 and top_p 1.0 disable those filters.
  seed None lets the engine draw one; with a seed, the token sampled at sequence position
  p depends only on (seed, p, logits), never on which slot or batch it shared.
  stop_strings need an engine built with a `detokenize` function. The stop token or
  string is kept in the output (token in, token out: the trajectory keeps what was
  sampled). logprobs False: the request does not want its tokens' log-probs (evaluation,
  serving without them), so a decode call in which no running request wants them skips
  that pass over the vocabulary; its Generation.logprobs are then NaN. RL keeps the
  default: the learner's importance ratio needs them.
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  max_tokens: int = 256
  stop_tokens: tuple[int, ...] = ()
  stop_strings: tuple[str, ...] = ()
  seed: int | None = None
  logprobs: bool = True

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"SamplingParams.temperature = {self.temperature}; use >= 0 "
                       "(0 means greedy).")
    if self.top_k < 0:
      raise ValueError(f"SamplingParams.top_k = {self.top_k}; use >= 0 (0 disables it).")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"SamplingParams.top_p = {self.top_p}; use a value in (0, 1].")
    if self.max_tokens < 1:
      raise ValueError(f"SamplingParams.max_tokens = {self.max_tokens}; use >= 1.")


@dataclasses.dataclass(frozen=True)
class Request:
  """Append `tokens` to a sequence, then sample until a stop condition.

  seq_id None starts a new sequence (tokens = the prompt); otherwise it extends the live
  sequence `seq_id` (tokens = e.g. a tool observation) without recomputing its prefix.
  keep_alive keeps the sequence's KV cache slot after it finishes so it can be extended
  later; release it with `Engine.release(seq_id)`.
  """
  tokens: np.ndarray | list[int]
  sampling: SamplingParams = SamplingParams()
  seq_id: int | None = None
  keep_alive: bool = False


@dataclasses.dataclass
class Generation:
  """The outcome of one Request. Shapes: P appended tokens, N sampled, Lm MoE layers,
  K experts per token.

  expert_indices[i] are the experts each MoE layer chose for token i of
  `concat(prompt_tokens, tokens)` when that token was fed to the model (the routing a
  training forward replays for that input position). versions[i] is the policy version
  whose logits sampled tokens[i]; logprobs[i] is log p(tokens[i]) under the
  distribution it was drawn from (temperature, then top-k / top-p renormalised:
  sampling.recorded_logprobs, so the learner's importance ratio is exact; greedy tokens
  the plain log-softmax), NaN where the request asked for none (SamplingParams.logprobs
  False).
  """
  seq_id: int
  prompt_tokens: np.ndarray  # [P] int32
  tokens: np.ndarray  # [N] int32
  logprobs: np.ndarray  # [N] float32
  versions: np.ndarray  # [N] int32
  expert_indices: np.ndarray  # [P + N, Lm, K] int32
  finish_reason: str  # one of FINISH_REASONS
