"""State tracking (report App. B, LoCoDiff-style): rebuild a file from its first version and
a sequence of unified diffs.

The base model reads a plain-text prompt (no chat template: this evaluates base
checkpoints) that shows the original file and the diffs, and ends by opening a fenced
block for the final content; it continues greedily until it closes the block (the stop
string), emits EOS or runs out of budget. The answer is the text inside the block
(`extract_answer`, which never raises), and the case's score is
`levenshtein.similarity(answer, truth) = 1 - Levenshtein(answer, truth) / max(len)`, in
characters. The eval reports the mean score over cases and the exact-match rate.

Generation goes through any c2jax rollout Engine (JaxEngine for a model, FakeEngine in
tests); the engine must be built with `detokenize=tokenizer.decode` for the stop string.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from c2jax.eval.base import levenshtein
from c2jax.eval.base.state_cases import Case
from c2jax.rollout import Request, SamplingParams

FENCE = "```"

DEFAULT_TEMPLATE = (
    "Below is the original content of the file {path}, followed by {num_diffs} unified "
    "diffs that were applied to it in order. Reproduce the file's exact content after all "
    "the diffs are applied.\n\n"
    "Original content of {path}:\n" + FENCE + "\n{initial}" + FENCE + "\n\n"
    "{diffs}\n"
    "Final content of {path}:\n" + FENCE + "\n")
DEFAULT_DIFF_TEMPLATE = "Diff {index} of {num_diffs}:\n" + FENCE + "diff\n{diff}" + FENCE + "\n"


@dataclasses.dataclass(frozen=True)
class StateTrackingOptions:
  """How a case becomes a prompt and how much the model may write.

  template: fields {path}, {num_diffs}, {initial}, {diffs} (the rendered diff blocks).
    When it ends with an opened fence line, the completion is read as the block's body.
  diff_template: fields {index} (from 1), {num_diffs}, {diff}.
  max_new_tokens: the generation budget is min(room left in the engine,
    max_new_tokens_factor * tokens of the truth + max_new_tokens_slack, max_new_tokens_cap)
    (cap 0: none).
  add_bos: start the prompt with BOS, as the documents of pretraining do.
  """
  template: str = DEFAULT_TEMPLATE
  diff_template: str = DEFAULT_DIFF_TEMPLATE
  max_new_tokens_factor: float = 1.5
  max_new_tokens_slack: int = 32
  max_new_tokens_cap: int = 0
  stop_strings: tuple[str, ...] = ("\n" + FENCE,)
  add_bos: bool = True

  def validate(self) -> None:
    for name, template, fields in (
        ("template", self.template, dict(path="p", num_diffs=1, initial="i", diffs="d")),
        ("diff_template", self.diff_template, dict(index=1, num_diffs=1, diff="d"))):
      try:
        template.format(**fields)
      except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"StateTrackingOptions.{name} = {template[:60]!r}...: fields may "
                         f"only be {sorted(fields)} (write literal braces as {{{{ }}}}); "
                         f"got {e!r}.") from e
    if (self.max_new_tokens_factor <= 0 or self.max_new_tokens_slack < 0
        or self.max_new_tokens_cap < 0):
      raise ValueError("StateTrackingOptions: max_new_tokens_factor must be > 0, "
                       "max_new_tokens_slack >= 0 and max_new_tokens_cap >= 0.")

  def budget(self, truth_tokens: int) -> int:
    wanted = int(self.max_new_tokens_factor * truth_tokens + self.max_new_tokens_slack)
    return min(wanted, self.max_new_tokens_cap) if self.max_new_tokens_cap else wanted

  @property
  def opens_block(self) -> bool:
    return self.template.endswith(FENCE + "\n")


def render_prompt(case: Case, options: StateTrackingOptions = StateTrackingOptions()) -> str:
  initial = case.initial if case.initial.endswith("\n") or not case.initial else (
      case.initial + "\n")
  blocks = "".join(
      options.diff_template.format(index=i + 1, num_diffs=len(case.diffs),
                                   diff=d if d.endswith("\n") or not d else d + "\n")
      for i, d in enumerate(case.diffs))
  return options.template.format(path=case.path, num_diffs=len(case.diffs), initial=initial,
                                 diffs=blocks)


def extract_answer(completion: str, opened: bool = True) -> str:
  """The final content in a completion; never raises.

  opened (the prompt ended with an opening fence): the text up to the first line that
  is a closing fence, or all of it when the block was never closed. Otherwise the body of
  the first fenced block (its info string, e.g. ```python, dropped), the rest of the text
  after an unclosed opening fence, or the whole completion when there is no fence.
  """
  if not isinstance(completion, str):
    return ""
  lines = completion.split("\n")
  if not opened:
    start = next((i for i, line in enumerate(lines) if line.startswith(FENCE)), None)
    if start is None:
      return completion
    lines = lines[start + 1:]
  end = next((i for i, line in enumerate(lines) if line.strip() == FENCE), None)
  if end is None:
    return "\n".join(lines)
  # The content ended with the newline before the closing fence.
  return "".join(line + "\n" for line in lines[:end])


def score_answer(answer: str, truth: str) -> float:
  return levenshtein.similarity(answer, truth)


@dataclasses.dataclass(frozen=True)
class CaseResult:
  id: str
  score: float
  exact: bool
  prompt_tokens: int
  completion_tokens: int
  finish_reason: str
  answer: str


@dataclasses.dataclass(frozen=True)
class StateTrackingResult:
  cases: tuple[CaseResult, ...]
  skipped: tuple[str, ...]  # ids of cases whose prompt did not fit the engine
  seconds: float

  @property
  def mean_score(self) -> float:
    return float(np.mean([c.score for c in self.cases]))

  @property
  def exact_match(self) -> float:
    return float(np.mean([c.exact for c in self.cases]))

  @property
  def cases_per_second(self) -> float:
    return len(self.cases) / self.seconds if self.seconds > 0 else float("inf")

  def summary(self) -> dict:
    scores = [c.score for c in self.cases]
    return {"mean_score": self.mean_score, "exact_match": self.exact_match,
            "stderr": float(np.std(scores, ddof=1) / np.sqrt(len(scores)))
            if len(scores) > 1 else 0.0,
            "cases": len(self.cases), "skipped": len(self.skipped),
            "completion_tokens": int(sum(c.completion_tokens for c in self.cases)),
            "seconds": self.seconds, "cases_per_second": self.cases_per_second}

  def by_prompt_length(self) -> dict[str, dict]:
    """Mean score and exact-match rate per prompt-length bucket (powers of 2 tokens), as
    LoCoDiff plots them: longer histories are harder."""
    buckets: dict[int, list[CaseResult]] = {}
    for case in self.cases:
      upper = 1 << max(0, case.prompt_tokens - 1).bit_length()
      buckets.setdefault(upper, []).append(case)
    return {f"<={upper}": {"cases": len(group),
                           "mean_score": float(np.mean([c.score for c in group])),
                           "exact_match": float(np.mean([c.exact for c in group]))}
            for upper, group in sorted(buckets.items())}

  def to_json(self) -> dict:
    return {**self.summary(), "by_prompt_length": self.by_prompt_length(),
            "skipped_ids": list(self.skipped),
            "per_case": [dataclasses.asdict(c) for c in self.cases]}


def prepare(max_length: int, tokenizer, cases: Sequence[Case],
            options: StateTrackingOptions = StateTrackingOptions(), *, seed: int = 0
            ) -> tuple[list[Request], list[Case], list[str]]:
  """(requests, the cases they belong to, ids of skipped cases) for an engine of
  `max_length`: cases whose prompt leaves no room to write the true final content and
  close the block are skipped (see `run`)."""
  requests, kept, skipped = [], [], []
  stops = (tokenizer.eos_id,)
  for case in cases:
    prompt = tokenizer.encode(render_prompt(case, options))
    if options.add_bos:
      prompt = np.concatenate([np.int32([tokenizer.bos_id]), prompt])
    truth_tokens = len(tokenizer.encode(case.final))
    wanted = options.budget(truth_tokens)
    room = max_length - len(prompt) - 1
    if room < truth_tokens + 2:  # the answer and a closing fence could not fit
      skipped.append(case.id)
      continue
    sampling = SamplingParams(temperature=0.0, max_tokens=max(1, min(wanted, room)),
                              stop_tokens=stops, stop_strings=options.stop_strings,
                              seed=seed)
    requests.append(Request(prompt, sampling))
    kept.append(case)
  return requests, kept, skipped


def score_generations(tokenizer, cases: Sequence[Case], generations,
                      options: StateTrackingOptions = StateTrackingOptions()
                      ) -> list[CaseResult]:
  """Each case's answer read from its engine Generation, scored against the truth."""
  stops = (tokenizer.eos_id,)
  results = []
  for case, generation in zip(cases, generations, strict=True):
    tokens = [t for t in generation.tokens.tolist() if t not in stops]
    answer = extract_answer(tokenizer.decode(tokens), options.opens_block)
    results.append(CaseResult(case.id, score_answer(answer, case.final),
                              answer == case.final, len(generation.prompt_tokens),
                              len(generation.tokens), generation.finish_reason, answer))
  return results


def run(engine, tokenizer, cases: Sequence[Case],
        options: StateTrackingOptions = StateTrackingOptions(), *,
        seed: int = 0) -> StateTrackingResult:
  """Generates every case's answer greedily with `engine` and scores it.

  Cases whose prompt leaves no room in the engine (max_length) to write the true final
  content and close the block are skipped and listed, not scored as failures: raise the
  engine's max_length to include them. All requests are submitted at once so the engine batches them.
  """
  options.validate()
  if not cases:
    raise ValueError("state tracking got no cases; build them with "
                     "tools/tasks/build_state_tracking.py or state_cases.procedural_cases().")
  began = time.perf_counter()
  requests, kept, skipped = prepare(engine.max_length, tokenizer, cases, options, seed=seed)
  if not kept:
    raise ValueError(f"every case's prompt is longer than the engine's max_length "
                     f"{engine.max_length}; build the engine with a larger max_length or "
                     "make shorter cases (build_state_tracking.py --max-chars).")
  results = score_generations(tokenizer, kept, engine.generate(requests), options)
  return StateTrackingResult(tuple(results), tuple(skipped), time.perf_counter() - began)
