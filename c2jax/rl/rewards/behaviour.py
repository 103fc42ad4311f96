"""Behaviour graders: how an agent worked and communicated, beyond counters (report §4).

A grader reads a finished chain's OpenAI-style transcript and returns a Verdict, a score
in [0, 1] (1: nothing to object to) and a reason. Graders are a registry
(`register_grader`); rule-based ones ship here, a model grader through any
OpenAI-compatible endpoint in model_grader.py. Grading is I/O at the edge (the actor
calls `grade` when it assembles a group); the reward term `behaviour` (rewards.py) then
reads the scores from TrajectoryStats.behaviour, so rewards stay pure functions:

  reward.behaviour = -scale * sum_g weight_g * (1 - score_g)

  cot_comments    long comment blocks or first-person reasoning ("let me", "I think",
                  "wait,") left in the code the agent wrote: chain of thought in the diff
  shell_collapse  shell calls that do what an available dedicated tool does (cat/head/
                  sed -n for read_file, grep/rg for grep, ls/find for list_dir/glob,
                  sed -i / heredoc / > redirection for edit_file/write_file)
  final_message   the answer to the user: present, neither too short nor too long, no
                  leaked reasoning or code dump, names a file it changed
  model           an LLM judge behind an OpenAI-compatible endpoint (model_grader.py)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from c2jax.rl.rewards import model_grader
from c2jax.rl.rewards.grading import GraderError, Transcript, Verdict

_GRADERS: dict[str, Callable] = {}

# First-person working-out that belongs in thinking, not in code or the final answer.
_REASONING = re.compile(
    r"\b(let me|let's see|i think|i'll|i will|i need to|we need to|wait[,.]|hmm+|"
    r"actually[,.]|on second thought|maybe we|not sure)\b", re.I)
_COMMENT = re.compile(r"^\s*(#|//)(?!!)(.*)$")
_PRAGMA = re.compile(r"^\s*#\s*(type:|noqa|pylint:|fmt:|pragma|-\*-)", re.I)


def register_grader(name: str):
  def wrap(fn):
    if name in _GRADERS:
      raise ValueError(f"behaviour grader {name!r} is registered twice.")
    _GRADERS[name] = fn
    return fn
  return wrap


def grader_names() -> list[str]:
  return sorted(_GRADERS)


@register_grader("cot_comments")
def cot_comments(transcript: Transcript, cfg) -> Verdict:
  offences = []
  for text in transcript.written_code(cfg.shell_tool):
    run = 0
    for line in text.splitlines() + [""]:
      match = _COMMENT.match(line)
      if match and not _PRAGMA.match(line):
        run += 1
        if _REASONING.search(match.group(2)):
          offences.append(f"reasoning in a comment: {line.strip()[:80]!r}")
        continue
      if run > cfg.max_comment_lines:
        offences.append(f"a {run}-line comment block")
      run = 0
  if not offences:
    return Verdict(1.0, "no chain-of-thought comments in the written code")
  return Verdict(1.0 / (1 + len(offences)), "; ".join(offences[:5]))


# Shell commands that redo a dedicated tool, by the tool they replace.
_SHELL_FOR_TOOL = {
    "read_file": re.compile(r"^\s*(cat|head|tail|nl|less|more)\s+[^<|>]*$|^\s*sed\s+-n\b"),
    "grep": re.compile(r"^\s*(grep|egrep|rg|ag|ack)\b"),
    "list_dir": re.compile(r"^\s*ls\b"),
    "glob": re.compile(r"^\s*find\b.*-name\b"),
    "edit_file": re.compile(r"^\s*sed\s+-i\b|^\s*perl\s+-p?i\b"),
    "write_file": re.compile(r"^\s*(cat|tee)\b.*(>|<<)|^\s*(echo|printf)\b.*>"),
}


@register_grader("shell_collapse")
def shell_collapse(transcript: Transcript, cfg) -> Verdict:
  calls = transcript.tool_calls
  if not calls:
    return Verdict(1.0, "no tool calls")
  available = set(cfg.dedicated_tools)
  redone: dict[str, int] = {}
  for call in calls:
    if call.name != cfg.shell_tool:
      continue
    command = str(call.arguments.get("command", ""))
    for tool, pattern in _SHELL_FOR_TOOL.items():
      if tool in available and pattern.search(command):
        redone[tool] = redone.get(tool, 0) + 1
        break
  total = sum(redone.values())
  if not total:
    return Verdict(1.0, "the shell was used for what only the shell does")
  listing = ", ".join(f"{n} x {tool}" for tool, n in sorted(redone.items()))
  return Verdict(1.0 - total / len(calls),
                 f"{total} of {len(calls)} tool calls were shell commands standing in for "
                 f"dedicated tools ({listing})")


@register_grader("final_message")
def final_message(transcript: Transcript, cfg) -> Verdict:
  text = transcript.final_message.strip()
  problems = []
  if len(text) < cfg.min_chars:
    problems.append(f"the final message has {len(text)} characters (< {cfg.min_chars})")
  if len(text) > cfg.max_chars:
    problems.append(f"the final message has {len(text)} characters (> {cfg.max_chars})")
  if _REASONING.search(text[:200]) or "<think>" in text:
    problems.append("it opens with working-out instead of the result")
  code_lines, fenced = 0, False
  for line in text.splitlines():
    if line.strip().startswith("```"):
      fenced = not fenced
    elif fenced:
      code_lines += 1
  if code_lines > cfg.max_code_lines:
    problems.append(f"it pastes {code_lines} lines of code (> {cfg.max_code_lines})")
  edited = transcript.edited_paths()
  if edited and text and not any(p.rsplit("/", 1)[-1] in text for p in edited):
    problems.append("it names none of the files it changed")
  checks = 5 if edited else 4
  if not problems:
    return Verdict(1.0, "a clear final message")
  return Verdict(max(0.0, 1.0 - len(problems) / checks), "; ".join(problems))


register_grader("model")(model_grader.model_judge)


def grade(behaviour_cfg, messages: list[dict]) -> tuple[dict[str, float], dict[str, str]]:
  """(score, reason) per grader with a positive weight, for one chain's transcript.
  Raises GraderError if a grader could not decide (the caller treats it like any
  infrastructure failure)."""
  transcript = Transcript(messages)
  scores, reasons = {}, {}
  for name in behaviour_cfg.graders.keys():
    grader_cfg = behaviour_cfg.graders[name]
    if grader_cfg.weight <= 0:
      continue
    if name not in _GRADERS:
      raise ValueError(f"config.rl.reward.behaviour.graders.{name} is not a behaviour "
                       f"grader; known graders: {grader_names()}.")
    verdict = _GRADERS[name](transcript, grader_cfg)
    if not 0.0 <= verdict.score <= 1.0:
      raise GraderError(f"behaviour grader {name!r} scored {verdict.score}, outside [0, 1].")
    scores[name], reasons[name] = float(verdict.score), verdict.reason
  return scores, reasons


def penalty(behaviour_cfg, scores: dict[str, float]) -> float:
  """-scale * sum_g weight_g * (1 - score_g) over graders with a positive weight."""
  if behaviour_cfg.scale == 0:
    return 0.0
  total = 0.0
  for name in behaviour_cfg.graders.keys():
    weight = behaviour_cfg.graders[name].weight
    if weight <= 0:
      continue
    if name not in scores:
      raise ValueError(f"reward term behaviour: no score from grader {name!r}; run "
                       "c2jax.rl.rewards.behaviour.grade on the chain's transcript before the "
                       "reward (rollouts.make_group does).")
    total += weight * (1.0 - scores[name])
  return -behaviour_cfg.scale * total


def graded_stats(reward_cfg, trajectory):
  """trajectory.stats with its behaviour scores when the `behaviour` term is on (else
  unchanged, and no grader runs)."""
  if "behaviour" not in reward_cfg or reward_cfg.behaviour.scale == 0:
    return trajectory.stats
  scores, _ = grade(reward_cfg.behaviour, trajectory.messages)
  return dataclasses.replace(trajectory.stats, behaviour=scores)
