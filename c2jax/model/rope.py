"""Rotary position embeddings, with YaRN scaling computed exactly as HF transformers does.

`frequencies(cfg, dim)` gives the per-pair inverse frequencies and the attention factor
that multiplies cos/sin (HF `_compute_yarn_parameters`); `apply` rotates q or k. Two
layouts of the rotated features:
  interleave=True   pairs are (x0, x1), (x2, x3), ...: DeepSeek/Kimi checkpoints
                    (HF `rope_interleave`); the output is written in rotate-half order, as
                    HF does, which is fine since q and k are permuted alike.
  interleave=False  pairs are (x_i, x_{i+R/2}): HF `rotate_half` (Qwen3).

Shape legend: B batch, L length, H heads, R rotary dim (even).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
  if scale <= 1:
    return 1.0
  return 0.1 * mscale * math.log(scale) + 1.0


def frequencies(rope_cfg, dim: int) -> tuple[np.ndarray, float]:
  """(inv_freq [dim/2] float32, attention_factor) for `rope_cfg` (cfg.rope) and rotary dim."""
  base = float(rope_cfg.theta)
  exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
  pos_freqs = np.power(np.float32(base), exponents, dtype=np.float32)
  inv_freq = (np.float32(1.0) / pos_freqs).astype(np.float32)
  if rope_cfg.scaling == "none":
    return inv_freq, 1.0
  if rope_cfg.scaling != "yarn":
    raise ValueError(f"config.rope.scaling = {rope_cfg.scaling!r}; expected 'none' or 'yarn'.")

  factor = float(rope_cfg.factor)
  mscale, mscale_all_dim = rope_cfg.mscale, rope_cfg.mscale_all_dim
  if mscale and mscale_all_dim:
    attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
  else:
    attention_factor = _yarn_mscale(factor)

  # Dimensions rotating fewer than beta_slow times over the original context are fully
  # interpolated (divided by `factor`), those rotating more than beta_fast times are kept;
  # a linear ramp blends the ones in between (HF truncates the range to integers).
  original = float(rope_cfg.original_max_position)

  def correction_dim(num_rotations: float) -> float:
    return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

  low = max(math.floor(correction_dim(rope_cfg.beta_fast)), 0)
  high = min(math.ceil(correction_dim(rope_cfg.beta_slow)), dim - 1)
  if low == high:
    high += 0.001  # as HF: avoids a division by zero in the ramp
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low))
                 / np.float32(high - low), 0, 1).astype(np.float32)
  extrapolation_weight = np.float32(1) - ramp
  inv_freq_interpolation = (np.float32(1.0) / (np.float32(factor) * pos_freqs)).astype(
      np.float32)
  inv_freq = (inv_freq_interpolation * (np.float32(1) - extrapolation_weight)
              + inv_freq * extrapolation_weight).astype(np.float32)
  return inv_freq, float(attention_factor)


def mla_softmax_scale(cfg) -> float:
  """DeepSeek's softmax scale: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2
  under YaRN when mscale_all_dim is set (HF `yarn_apply_mscale`)."""
  scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
  if cfg.rope.scaling != "none" and cfg.rope.mscale_all_dim:
    m = _yarn_mscale(float(cfg.rope.factor), cfg.rope.mscale_all_dim)
    scale *= m * m
  return scale


class Rope:
  """Rotates the trailing R features of q/k by their token positions."""

  def __init__(self, rope_cfg, dim: int):
    self.dim = dim
    self.interleave = bool(rope_cfg.interleave)
    self.inv_freq, self.attention_factor = frequencies(rope_cfg, dim)

  def __call__(self, x_BxLxHxR: jax.Array, positions_BxL: jax.Array) -> jax.Array:
    if x_BxLxHxR.shape[-1] != self.dim:
      raise ValueError(f"RoPE built for {self.dim} rotary dims got {x_BxLxHxR.shape[-1]}.")
    # Angles in float32 (as HF) so large positions keep their precision in bf16 runs.
    angles_BxLxR2 = (positions_BxL.astype(jnp.float32)[..., None]
                     * jnp.asarray(self.inv_freq)[None, None, :])
    cos = (jnp.cos(angles_BxLxR2) * self.attention_factor).astype(x_BxLxHxR.dtype)[:, :, None]
    sin = (jnp.sin(angles_BxLxR2) * self.attention_factor).astype(x_BxLxHxR.dtype)[:, :, None]
    if self.interleave:
      x1, x2 = x_BxLxHxR[..., 0::2], x_BxLxHxR[..., 1::2]
    else:
      x1, x2 = jnp.split(x_BxLxHxR, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
