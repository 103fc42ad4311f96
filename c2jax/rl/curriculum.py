"""Curriculum: draw prompts (without replacement, single epoch) favouring hard ones.

Difficulty comes from earlier rollouts of a prompt (an earlier policy, an evaluation
pass, or the SFT model): how many turns and thinking tokens they needed, each relative
to the mean over observed prompts,
  d = turns_weight * turns / mean(turns) + thinking_weight * thinking / mean(thinking),
normalised so the mean observed prompt has d = 1; unobserved prompts count as average.
A prompt is drawn with probability proportional to d ** strength among those left:
strength 0 is uniform, larger values upsample hard prompts more (the report's curriculum
later in training).
"""

from __future__ import annotations

import numpy as np


class CurriculumSampler:

  def __init__(self, prompt_ids, strength: float, turns_weight: float = 1.0,
               thinking_weight: float = 1.0, seed: int = 0):
    if strength < 0 or turns_weight < 0 or thinking_weight < 0 or (
        turns_weight + thinking_weight == 0):
      raise ValueError("CurriculumSampler needs strength >= 0 and non-negative weights "
                       "with a positive sum (config.rl.curriculum).")
    self._remaining = list(dict.fromkeys(prompt_ids))
    self._strength = strength
    self._weights = (turns_weight, thinking_weight)
    self._observed: dict[str, list[tuple[float, float]]] = {}
    self._rng = np.random.default_rng(seed)

  def observe(self, prompt_id: str, turns: float, thinking_tokens: float) -> None:
    """Records one earlier rollout of `prompt_id`."""
    self._observed.setdefault(prompt_id, []).append((float(turns), float(thinking_tokens)))

  def difficulty(self, prompt_id: str) -> float:
    if prompt_id not in self._observed:
      return 1.0
    means = {p: np.mean(v, axis=0) for p, v in self._observed.items()}
    pool_mean = np.mean(list(means.values()), axis=0)
    ratios = [m / pool_mean[i] if pool_mean[i] > 0 else 1.0
              for i, m in enumerate(means[prompt_id])]
    return float(np.dot(self._weights, ratios) / sum(self._weights))

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
