"""What a finished agent chain (or one of its segments) did: the counts the agent loop
records and the rewards (c2jax.rl.rewards.terms) and evaluation read."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

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
