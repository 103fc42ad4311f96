"""Curricula: which prompt the pool leases next (config.rl.curriculum.sampling).

'order' (CurriculumSampler): every prompt once (single epoch), hard ones first.
Difficulty comes from earlier rollouts of a prompt (an earlier policy, an evaluation
pass, or the SFT model): how many turns and thinking tokens they needed, each relative
to the mean over observed prompts,
  d = turns_weight * turns / mean(turns) + thinking_weight * thinking / mean(thinking),
normalised so the mean observed prompt has d = 1; unobserved prompts count as average.
A prompt is drawn with probability proportional to d ** strength among those left:
strength 0 is uniform, larger values upsample hard prompts more.

'running' (RunningCurriculum): prompts are drawn with replacement, for as long as the
learner trains, with weights from running statistics of the groups trained so far (the
report's curriculum: later in training, upsample from earlier rollouts). Per prompt it
keeps exponential moving averages (EMA, weight `ema` on the newest group) of the pass
rate p, turns and thinking tokens. A group of G rollouts teaches nothing when they all
pass or all fail (every advantage is zero); with pass rate p that happens with
probability p**G + (1 - p)**G, so a prompt's learning signal is
  s(p) = 1 - p**G - (1 - p)**G
(largest at p = 1/2, zero at p = 0 and p = 1), and its weight is
  w = max(s(p), min_weight) * d ** strength.
Unseen prompts have p = prior_pass. The floor keeps solved and hopeless prompts drawable
at a low rate, so their averages keep moving: a prompt the policy has learned drifts
down as its newest groups pass, a prompt it has forgotten comes back.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

SAMPLINGS = ("order", "running")
_DRAW_RE = re.compile(r"(.+)\.draw(\d+)")


def draw_id(prompt_id: str, index: int) -> str:
  """The pool id of the `index`-th draw of the run, a draw of `prompt_id`."""
  return f"{prompt_id}.draw{index}"


def prompt_of(group_id: str) -> str:
  """The prompt a draw (or group) id was drawn from."""
  match = _DRAW_RE.fullmatch(group_id)
  if match is None:
    raise ValueError(f"{group_id!r} is not a curriculum draw id (<prompt>.draw<n>); was "
                     "this run started with config.rl.curriculum.sampling = 'order'?")
  return match.group(1)


def _relative_difficulty(means: dict[str, np.ndarray], weights) -> dict[str, float]:
  """d per observed prompt from its mean (turns, thinking tokens) (module docstring)."""
  if not means:
    return {}
  pool_mean = np.mean(list(means.values()), axis=0)
  difficulty = {}
  for prompt_id, mean in means.items():
    ratios = [m / pool_mean[i] if pool_mean[i] > 0 else 1.0 for i, m in enumerate(mean)]
    difficulty[prompt_id] = float(np.dot(weights, ratios) / sum(weights))
  return difficulty


def _check_weights(strength, turns_weight, thinking_weight) -> None:
  if strength < 0 or turns_weight < 0 or thinking_weight < 0 or (
      turns_weight + thinking_weight == 0):
    raise ValueError("A curriculum needs strength >= 0 and non-negative weights with a "
                     "positive sum (config.rl.curriculum).")


class CurriculumSampler:

  def __init__(self, prompt_ids, strength: float, turns_weight: float = 1.0,
               thinking_weight: float = 1.0, seed: int = 0):
    _check_weights(strength, turns_weight, thinking_weight)
    self._remaining = list(dict.fromkeys(prompt_ids))
    self._strength = strength
    self._weights = (turns_weight, thinking_weight)
    self._observed: dict[str, list[tuple[float, float]]] = {}
    self._rng = np.random.default_rng(seed)

  def observe(self, prompt_id: str, turns: float, thinking_tokens: float) -> None:
    """Records one earlier rollout of `prompt_id`."""
    self._observed.setdefault(prompt_id, []).append((float(turns), float(thinking_tokens)))

  def difficulty(self, prompt_id: str) -> float:
    means = {p: np.mean(v, axis=0) for p, v in self._observed.items()}
    return _relative_difficulty(means, self._weights).get(prompt_id, 1.0)

  def draw(self, n: int) -> list[str]:
    """Up to n prompts not drawn before (fewer when the pool runs out)."""
    n = min(n, len(self._remaining))
    if n == 0:
      return []
    # The floor keeps prompts whose earlier rollouts took no turns drawable.
    difficulty = np.array([self.difficulty(p) for p in self._remaining])
    weights = np.maximum(difficulty, 1e-6) ** self._strength
    picks = self._rng.choice(len(self._remaining), size=n, replace=False,
                             p=weights / weights.sum())
    drawn = [self._remaining[i] for i in picks]
    chosen = set(picks.tolist())
    self._remaining = [p for i, p in enumerate(self._remaining) if i not in chosen]
    return drawn

  def __len__(self) -> int:
    return len(self._remaining)


@dataclasses.dataclass
class PromptStats:
  """Moving averages over a prompt's trained groups."""
  pass_rate: float
  turns: float
  thinking_tokens: float
  groups: int  # how many groups were averaged in


class RunningCurriculum:
  """Draws prompts with replacement, weighted by running statistics (module docstring).

  The learner feeds it every group it trains (`observe_group`), asks it for draws to
  keep the pool filled (`draw`), and saves `state()` in its checkpoint, so a restarted
  learner continues with the statistics of exactly the groups its parameters saw.
  """

  def __init__(self, prompt_ids, group_size: int, *, ema: float, prior_pass: float,
               min_weight: float, strength: float = 0.0, turns_weight: float = 1.0,
               thinking_weight: float = 1.0, seed: int = 0):
    _check_weights(strength, turns_weight, thinking_weight)
    self.prompt_ids = list(dict.fromkeys(prompt_ids))
    if not self.prompt_ids:
      raise ValueError("RunningCurriculum needs at least one prompt.")
    if group_size < 1 or not 0 < ema <= 1 or not 0 <= prior_pass <= 1 or not (
        0 < min_weight <= 1):
      raise ValueError(f"RunningCurriculum needs group_size >= 1 (got {group_size}), ema in "
                       f"(0, 1] ({ema}), prior_pass in [0, 1] ({prior_pass}) and min_weight "
                       f"in (0, 1] ({min_weight}); see config.rl.curriculum.")
    self.group_size, self.ema, self.prior_pass = group_size, ema, prior_pass
    self.min_weight, self.strength = min_weight, strength
    self._weights = (turns_weight, thinking_weight)
    self.seed = seed
    self._known = set(self.prompt_ids)
    self.stats: dict[str, PromptStats] = {}

  def observe_group(self, prompt_id: str, solved, turns, thinking_tokens) -> None:
    """Folds one finished group of `prompt_id` (one value per rollout) into its averages."""
    if prompt_id not in self._known:
      raise KeyError(f"Prompt {prompt_id!r} is not one of the curriculum's prompts.")
    if not len(solved) or not len(solved) == len(turns) == len(thinking_tokens):
      raise ValueError(f"Group of {prompt_id!r}: solved, turns and thinking_tokens need "
                       "one value per rollout (got lengths "
                       f"{len(solved)}, {len(turns)}, {len(thinking_tokens)}).")
    new = (float(np.mean(solved)), float(np.mean(turns)), float(np.mean(thinking_tokens)))
    old = self.stats.get(prompt_id)
    if old is None:
      self.stats[prompt_id] = PromptStats(*new, groups=1)
      return
    mix = lambda a, b: (1.0 - self.ema) * a + self.ema * b
    self.stats[prompt_id] = PromptStats(mix(old.pass_rate, new[0]), mix(old.turns, new[1]),
                                        mix(old.thinking_tokens, new[2]), old.groups + 1)

  def pass_rate(self, prompt_id: str) -> float:
    stats = self.stats.get(prompt_id)
    return self.prior_pass if stats is None else stats.pass_rate

  def signal(self, pass_rate: float) -> float:
    """Probability that a group of group_size rollouts has a nonzero advantage."""
    return 1.0 - pass_rate ** self.group_size - (1.0 - pass_rate) ** self.group_size

  def probabilities(self) -> np.ndarray:
    """The draw probability of each prompt, in `prompt_ids` order."""
    means = {p: np.array([s.turns, s.thinking_tokens]) for p, s in self.stats.items()}
    difficulty = _relative_difficulty(means, self._weights)
    weights = np.array([
        max(self.signal(self.pass_rate(p)), self.min_weight)
        * max(difficulty.get(p, 1.0), 1e-6) ** self.strength for p in self.prompt_ids])
    return weights / weights.sum()

  def draw(self, count: int, first_index: int) -> list[str]:
    """`count` prompt ids drawn with replacement; the draw indices first_index.. seed
    the generator, so the same state and indices give the same prompts."""
    if count <= 0:
      return []
    rng = np.random.default_rng([self.seed, first_index])
    picks = rng.choice(len(self.prompt_ids), size=count, p=self.probabilities())
    return [self.prompt_ids[i] for i in picks]

  def metrics(self) -> dict[str, float]:
    """Per-step summary: entropy of the draw distribution (nats) and its exponent (the
    effective number of prompts), the expected pass rate and learning signal of the next
    draw, and the fraction of prompts with a trained group."""
    p = self.probabilities()
    entropy = float(-np.sum(p * np.log(np.maximum(p, 1e-300))))
    pass_rates = np.array([self.pass_rate(i) for i in self.prompt_ids])
    return {
        "curriculum/entropy": entropy,
        "curriculum/effective_prompts": float(np.exp(entropy)),
        "curriculum/expected_pass_rate": float(np.dot(p, pass_rates)),
        "curriculum/expected_signal": float(np.dot(p, [self.signal(r) for r in pass_rates])),
        "curriculum/seen_fraction": len(self.stats) / len(self.prompt_ids),
    }

  def state(self) -> dict:
    """JSON-able statistics (for the learner's checkpoint)."""
    return {"stats": {p: dataclasses.asdict(s) for p, s in sorted(self.stats.items())}}

  def load_state(self, state: dict) -> None:
    unknown = sorted(set(state["stats"]) - self._known)
    if unknown:
      raise ValueError(f"The checkpoint's curriculum has statistics of {len(unknown)} "
                       f"prompt(s) this run does not train on (e.g. {unknown[:3]}); the "
                       "task source changed since the checkpoint was written.")
    self.stats = {p: PromptStats(**s) for p, s in state["stats"].items()}
