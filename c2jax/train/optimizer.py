"""AdamW with warmup + cosine decay, global-norm clipping, no decay on norms/biases.

Parameters that are not trained by gradients (the MoE correction bias) are frozen here:
their updates are exactly zero; `moe.update_correction_bias` moves them after each step.
"""

from __future__ import annotations

import jax
import optax

from c2jax import model


def weight_decay_mask(params):
  """True for matrices (kernels, embeddings, expert weights); False for 1-D scales/biases."""
  def decays(path, leaf):
    name = getattr(path[-1], "key", str(path[-1]))
    return name not in ("scale", "bias", "correction_bias") and leaf.ndim >= 2
  return jax.tree_util.tree_map_with_path(decays, params)


def _with_warmup(peak, warmup_steps, after):
  """Linear warmup from 0 over `warmup_steps` (none if 0), then `after` from its step 0."""
  if warmup_steps <= 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup_steps), after],
                              boundaries=[warmup_steps])


def _cosine(peak, total_steps, warmup_steps, end_fraction, decay_fraction):
  del decay_fraction
  decay = optax.cosine_decay_schedule(peak, max(total_steps - warmup_steps, 1),
                                      alpha=end_fraction)
  return _with_warmup(peak, warmup_steps, decay)


def _wsd(peak, total_steps, warmup_steps, end_fraction, decay_fraction):
  """Warmup-stable-decay: linear warmup, constant plateau, linear decay at the end."""
  decay_steps = max(int(total_steps * decay_fraction), 1)
  stable_steps = max(total_steps - warmup_steps - decay_steps, 0)
  after = optax.join_schedules(
      [optax.constant_schedule(peak),
       optax.linear_schedule(peak, peak * end_fraction, decay_steps)],
      boundaries=[stable_steps])
  return _with_warmup(peak, warmup_steps, after)


SCHEDULES = {"cosine": _cosine, "wsd": _wsd}


def make_optimizer(*, learning_rate: float, total_steps: int, warmup_steps: int = 0,
                   schedule: str = "cosine", weight_decay: float = 0.1, b1: float = 0.9,
                   b2: float = 0.95, eps: float = 1e-8, clip_norm: float = 1.0,
                   end_lr_fraction: float = 0.1, decay_fraction: float = 0.2):
  """(optimizer, learning-rate schedule); `schedule` is a key of SCHEDULES."""
  if schedule not in SCHEDULES:
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {sorted(SCHEDULES)}.")
  schedule = SCHEDULES[schedule](learning_rate, total_steps, warmup_steps, end_lr_fraction,
                                 decay_fraction)
  adamw = optax.chain(
      optax.clip_by_global_norm(clip_norm),
      optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                  mask=weight_decay_mask))
  labels = lambda params: jax.tree_util.tree_map(
      lambda trainable: "train" if trainable else "frozen", model.trainable_mask(params))
  return optax.multi_transform({"train": adamw, "frozen": optax.set_to_zero()}, labels), schedule
