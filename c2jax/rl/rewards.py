"""Trajectory rewards: a registry of terms summed into one scalar per chain.

A chain is one rollout: one or more segments joined by self-summaries. Its reward is
computed once, from `TrajectoryStats` of the whole chain (`TrajectoryStats.of_chain`), and
every segment trains on it (see groups.per_segment).

Terms (config.rl.reward.<name>; each has a `scale`, 0 switches it off):
  correctness      scale * (1 if every hidden test passed else 0), or the passing fraction
                   with `partial_credit`
  length_penalty   -scale * C(x; k, q) with C the concave `length_penalty` and
                   x = sum_c weights.c * count_c over COUNT_FIELDS
  tool_call_errors -scale * (tool calls that failed: bad JSON, unknown tool, tool error)
  unfinished_todos -scale * (to-do items still open when the chain ended)
  shell_only       -scale when the chain made tool calls and every one (ignoring
                   `ignore_tools`) went to `shell_tool`: the "collapse to the terminal"
                   behaviour the report penalises
  behaviour        -scale * sum_g weight_g * (1 - score_g) over the behaviour graders
                   (behaviour.py: chain-of-thought comments, shell collapse, final message,
                   an LLM judge); their scores are computed at the edge into
                   TrajectoryStats.behaviour
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from c2jax.rl.length_penalty import length_penalty

# The counts the length penalty weighs (report §4), in TrajectoryStats field names.
COUNT_FIELDS = ("thinking_tokens", "tool_call_tokens", "tool_output_tokens",
                "final_message_tokens", "tool_calls", "turns")


@dataclasses.dataclass(frozen=True)
class TrajectoryStats:
  """What the reward needs to know about a finished chain (or one of its segments).

  tests_passed / tests_total: hidden tests (FAIL_TO_PASS + PASS_TO_PASS) after grading.
  thinking_tokens: model tokens of reasoning; tool_call_tokens: model tokens inside tool
  calls; tool_output_tokens: observation tokens fed back; final_message_tokens: the
  answer to the user. turns: model turns. tool_call_counts: calls per tool name.
  tool_call_errors: calls that came back with an error status. unfinished_todos: to-do
  items open at the end. behaviour: behaviour grader scores of the whole chain.
  """
  tests_passed: int = 0
  tests_total: int = 0
  thinking_tokens: int = 0
  tool_call_tokens: int = 0
  tool_output_tokens: int = 0
  final_message_tokens: int = 0
  turns: int = 0
  tool_call_counts: dict[str, int] = dataclasses.field(default_factory=dict)
  tool_call_errors: int = 0
  unfinished_todos: int = 0
  behaviour: dict[str, float] = dataclasses.field(default_factory=dict)  # grader -> score

  def __post_init__(self):
    if not 0 <= self.tests_passed <= self.tests_total:
      raise ValueError(f"TrajectoryStats: tests_passed = {self.tests_passed} must be in "
                       f"[0, tests_total = {self.tests_total}].")

  @property
  def tool_calls(self) -> int:
    return sum(self.tool_call_counts.values())

  def counts(self) -> dict[str, int]:
    return {name: getattr(self, name) for name in COUNT_FIELDS}

  @classmethod
  def of_chain(cls, segments: Sequence[TrajectoryStats]) -> TrajectoryStats:
    """Whole-chain stats: counts add up; tests and to-dos are as the last segment left them."""
    if not segments:
      raise ValueError("TrajectoryStats.of_chain needs at least one segment.")
    summed = {name: sum(getattr(s, name) for s in segments)
              for name in COUNT_FIELDS + ("tool_call_errors",) if name != "tool_calls"}
    tool_call_counts: dict[str, int] = {}
    for s in segments:
      for tool, n in s.tool_call_counts.items():
        tool_call_counts[tool] = tool_call_counts.get(tool, 0) + n
    last = segments[-1]
    return cls(tests_passed=last.tests_passed, tests_total=last.tests_total,
               unfinished_todos=last.unfinished_todos, tool_call_counts=tool_call_counts,
               **summed)


def correctness(stats: TrajectoryStats, term_cfg) -> float:
  if stats.tests_total == 0:
    return 0.0  # nothing was graded: no evidence of success
  if term_cfg.partial_credit:
    score = stats.tests_passed / stats.tests_total
  else:
    score = float(stats.tests_passed == stats.tests_total)
  return term_cfg.scale * score


def weighted_length(stats: TrajectoryStats, weights) -> float:
  """x = sum_c weights[c] * count_c; `weights` must name every field of COUNT_FIELDS."""
  counts = stats.counts()
  missing = sorted(set(COUNT_FIELDS) - set(weights.keys()))
  if missing:
    raise ValueError(f"config.rl.reward.length_penalty.weights lacks {missing}; give a "
                     f"weight (0 to ignore) for each of {list(COUNT_FIELDS)}.")
  return float(sum(weights[c] * counts[c] for c in COUNT_FIELDS))


def length_penalty_term(stats: TrajectoryStats, term_cfg) -> float:
  x = weighted_length(stats, term_cfg.weights)
  return -term_cfg.scale * float(length_penalty(x, term_cfg.k, term_cfg.q))


def tool_call_errors(stats: TrajectoryStats, term_cfg) -> float:
  return -term_cfg.scale * stats.tool_call_errors


def unfinished_todos(stats: TrajectoryStats, term_cfg) -> float:
  return -term_cfg.scale * stats.unfinished_todos


def shell_only(stats: TrajectoryStats, term_cfg) -> float:
  used = {tool for tool, n in stats.tool_call_counts.items() if n > 0}
  used -= set(term_cfg.ignore_tools)
  return -term_cfg.scale * float(used == {term_cfg.shell_tool})


def behaviour_term(stats: TrajectoryStats, term_cfg) -> float:
  from c2jax.rl import behaviour  # pylint: disable=import-outside-toplevel
  return behaviour.penalty(term_cfg, stats.behaviour)


REWARD_TERMS: dict[str, Callable[[TrajectoryStats, object], float]] = {
    "correctness": correctness,
    "length_penalty": length_penalty_term,
    "tool_call_errors": tool_call_errors,
    "unfinished_todos": unfinished_todos,
    "shell_only": shell_only,
    "behaviour": behaviour_term,
}


def total_reward(reward_cfg, stats: TrajectoryStats) -> tuple[float, dict[str, float]]:
  """(reward, {term: value}) summed over the terms present in `reward_cfg`."""
  terms = {}
  for name in reward_cfg.keys():
    if name not in REWARD_TERMS:
      raise ValueError(f"config.rl.reward.{name} is not a reward term; known terms: "
                       f"{sorted(REWARD_TERMS)}.")
    terms[name] = REWARD_TERMS[name](stats, reward_cfg[name])
  return sum(terms.values()), terms
