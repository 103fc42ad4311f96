"""AdamW with warmup + cosine decay, global-norm clipping, no decay on norms/biases.

`clip_group` (optional) splits the global-norm clip into groups of leaves, each clipped by
its own norm: the RL learner trains its MTP heads beside the policy, and their gradient
must not scale the policy's update down (c2jax.rl.learner.step).

Parameters that are not trained by gradients (the MoE correction bias) are frozen here:
their updates are exactly zero; `moe.update_correction_bias` moves them after each step.
Adam's two moments are stored in `state_dtype` (the model's `opt_state_dtype`, part of
the mixed-precision policy in c2jax/model/config.py) whatever dtype the parameters and
gradients have; the moment arithmetic runs in float32 and the update is returned in each
parameter's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
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


class AdamState(NamedTuple):
  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def scale_by_adam(b1: float, b2: float, eps: float, state_dtype) -> optax.GradientTransformation:
  """Adam's direction with both moments kept in `state_dtype` (optax keeps the second
  moment in the parameters' dtype, which for bfloat16 masters would be bfloat16 too)."""
  state_dtype = jnp.dtype(state_dtype)

  def init(params):
    zeros = lambda p: jnp.zeros(p.shape, state_dtype)
    return AdamState(count=jnp.zeros((), jnp.int32), mu=jax.tree.map(zeros, params),
                     nu=jax.tree.map(zeros, params))

  def update(updates, state, params=None):
    del params
    count = optax.safe_increment(state.count)
    f32 = lambda x: x.astype(jnp.float32)
    mu = jax.tree.map(lambda g, m: b1 * f32(m) + (1 - b1) * f32(g), updates, state.mu)
    nu = jax.tree.map(lambda g, v: b2 * f32(v) + (1 - b2) * jnp.square(f32(g)), updates,
                      state.nu)
    step = count.astype(jnp.float32)
    mu_scale, nu_scale = 1 / (1 - b1 ** step), 1 / (1 - b2 ** step)
    direction = jax.tree.map(
        lambda g, m, v: (m * mu_scale / (jnp.sqrt(v * nu_scale) + eps)).astype(g.dtype),
        updates, mu, nu)
    store = lambda tree: jax.tree.map(lambda x: x.astype(state_dtype), tree)
    return direction, AdamState(count=count, mu=store(mu), nu=store(nu))

  return optax.GradientTransformation(init, update)


def clip_by_group_norm(max_norm: float,
                       clip_group: Callable[[tuple], str]) -> optax.GradientTransformation:
  """optax.clip_by_global_norm applied to each group of leaves on its own: `clip_group`
  maps a leaf's key path to its group's name, and a group's norm scales only its own
  leaves. Stateless (its state is optax's EmptyState, as clip_by_global_norm's)."""

  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params=None):
    del params
    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(updates)
    groups = [clip_group(path) for path, _ in paths_leaves]
    squares: dict[str, jax.Array] = {}
    for group, (_, leaf) in zip(groups, paths_leaves):
      squares[group] = squares.get(group, 0.0) + jnp.sum(jnp.square(leaf.astype(jnp.float32)))
    norms = {group: jnp.sqrt(total) for group, total in squares.items()}
    # As optax: leaves untouched below max_norm, scaled by max_norm / norm above it.
    clipped = [jnp.where(norms[group] < max_norm, leaf,
                         (leaf / norms[group] * max_norm).astype(leaf.dtype))
               for group, (_, leaf) in zip(groups, paths_leaves)]
    return jax.tree_util.tree_unflatten(treedef, clipped), state

  return optax.GradientTransformation(init, update)


def scale_groups(factors: dict[str, float],
                 group_of: Callable[[tuple], str]) -> optax.GradientTransformation:
  """Multiplies the updates of each group named in `factors` (group_of: key path ->
  group name) by its factor; other groups pass unchanged. Stateless."""

  def update(updates, state, params=None):
    del params
    scaled = jax.tree_util.tree_map_with_path(
        lambda path, u: u * jnp.asarray(factors.get(group_of(path), 1.0), u.dtype), updates)
    return scaled, state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(*, learning_rate: float, total_steps: int, warmup_steps: int = 0,
                   schedule: str = "cosine", weight_decay: float = 0.1, b1: float = 0.9,
                   b2: float = 0.95, eps: float = 1e-8, clip_norm: float = 1.0,
                   end_lr_fraction: float = 0.1, decay_fraction: float = 0.2,
                   state_dtype: str = "float32",
                   clip_group: Callable[[tuple], str] | None = None,
                   group_lr_scale: dict[str, float] | None = None):
  """(optimizer, learning-rate schedule); `schedule` is a key of SCHEDULES; the Adam
  moments are stored in `state_dtype`. `clip_group` (key path -> group name) clips each
  group by its own global norm (clip_by_group_norm); None clips all leaves together.
  `group_lr_scale` ({group name: factor}, needs clip_group) multiplies those groups'
  learning rate."""
  if group_lr_scale and clip_group is None:
    raise ValueError("make_optimizer: group_lr_scale needs clip_group (which names the "
                     "groups).")
  if schedule not in SCHEDULES:
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {sorted(SCHEDULES)}.")
  schedule = SCHEDULES[schedule](learning_rate, total_steps, warmup_steps, end_lr_fraction,
                                 decay_fraction)
  clip = (optax.clip_by_global_norm(clip_norm) if clip_group is None
          else clip_by_group_norm(clip_norm, clip_group))
  adamw = optax.chain(
      clip,
      scale_by_adam(b1, b2, eps, state_dtype),
      optax.add_decayed_weights(weight_decay, mask=weight_decay_mask),
      optax.scale_by_learning_rate(schedule),
      *([scale_groups(group_lr_scale, clip_group)] if group_lr_scale else []))
  labels = lambda params: jax.tree_util.tree_map(
      lambda trainable: "train" if trainable else "frozen", model.trainable_mask(params))
  return optax.multi_transform({"train": adamw, "frozen": optax.set_to_zero()}, labels), schedule
