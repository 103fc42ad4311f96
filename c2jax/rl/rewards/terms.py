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

from collections.abc import Callable

from c2jax.agent.stats import COUNT_FIELDS, TrajectoryStats
from c2jax.rl.rewards.length_penalty import length_penalty

# TrajectoryStats is the agent's record of a chain (c2jax.agent.stats); the rewards read it.


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
  from c2jax.rl.rewards import behaviour  # pylint: disable=import-outside-toplevel
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
