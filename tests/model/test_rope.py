"""RoPE and YaRN: frequencies, attention factor, DeepSeek softmax scale, both layouts."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from c2jax.model import rope, variants


def rope_cfg(**fields):
  base = dict(theta=10000.0, scaling="none", factor=1.0, original_max_position=4096,
              beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.0, interleave=True)
  base.update(fields)
  return ml_collections.ConfigDict(base)


def test_plain_frequencies_are_theta_powers():
  inv_freq, factor = rope.frequencies(rope_cfg(theta=500.0), 8)
  np.testing.assert_allclose(inv_freq, 500.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-6)
  assert factor == 1.0


def test_yarn_ramp_keeps_fast_dims_and_interpolates_slow_ones():
  dim, theta, original, factor = 64, 10000.0, 4096, 40.0
  plain, _ = rope.frequencies(rope_cfg(theta=theta), dim)
  yarn, _ = rope.frequencies(rope_cfg(theta=theta, scaling="yarn", factor=factor,
                                      original_max_position=original), dim)

  def correction_dim(rotations):
    return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

  low, high = math.floor(correction_dim(32.0)), math.ceil(correction_dim(1.0))
  assert 0 < low < high < dim // 2  # both regimes and a ramp exist at these settings
  np.testing.assert_allclose(yarn[:low + 1], plain[:low + 1], rtol=1e-6)  # extrapolated
  np.testing.assert_allclose(yarn[high:], plain[high:] / factor, rtol=1e-6)  # interpolated
  # In between, a linear blend: the weight on the interpolated frequency rises with i.
  i = np.arange(low + 1, high)
  weight = (plain[i] - yarn[i]) / (plain[i] - plain[i] / factor)
  np.testing.assert_allclose(weight, (i - low) / (high - low), rtol=1e-4)


@pytest.mark.parametrize("mscale,mscale_all_dim,expected", [
    (1.0, 0.0, 0.1 * math.log(40.0) + 1.0),  # only factor: HF get_mscale(factor)
    (1.0, 1.0, 1.0),  # DeepSeek-V3: ratio of equal mscales cancels
    (1.0, 0.707, (0.1 * math.log(40.0) + 1) / (0.0707 * math.log(40.0) + 1)),
])
def test_yarn_attention_factor(mscale, mscale_all_dim, expected):
  _, factor = rope.frequencies(
      rope_cfg(scaling="yarn", factor=40.0, mscale=mscale, mscale_all_dim=mscale_all_dim), 8)
  assert factor == pytest.approx(expected, rel=1e-12)


def test_deepseek_softmax_scale_has_mscale_squared():
  cfg = variants.get("deepseek_v3")
  mscale = 0.1 * 1.0 * math.log(40.0) + 1.0
  assert rope.mla_softmax_scale(cfg) == pytest.approx(192 ** -0.5 * mscale ** 2, rel=1e-12)
  plain = variants.get("deepseek_v3", rope=dict(scaling="none"))
  assert rope.mla_softmax_scale(plain) == pytest.approx(192 ** -0.5, rel=1e-12)


@pytest.mark.parametrize("interleave", [True, False])
def test_rotation_depends_only_on_relative_position(interleave):
  r = rope.Rope(rope_cfg(interleave=interleave, theta=100.0), 16)
  q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 1, 16))

  def score(pq, pk):
    rq = r(q, jnp.array([[pq]]))
    rk = r(k, jnp.array([[pk]]))
    return float(jnp.sum(rq * rk))

  assert score(7, 3) == pytest.approx(score(24, 20), abs=1e-5)
  assert score(7, 3) != pytest.approx(score(7, 5), abs=1e-3)
  # Rotation preserves the norm when the attention factor is 1.
  rotated = r(q, jnp.array([[11]]))
  assert float(jnp.linalg.norm(rotated)) == pytest.approx(float(jnp.linalg.norm(q)), rel=1e-5)


def test_interleaved_layout_is_rotate_half_of_deinterleaved_features():
  x = jax.random.normal(jax.random.key(1), (2, 5, 3, 8))
  positions = jnp.arange(10).reshape(2, 5) * 3
  interleaved = rope.Rope(rope_cfg(interleave=True), 8)(x, positions)
  deinterleaved = jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
  half = rope.Rope(rope_cfg(interleave=False), 8)(deinterleaved, positions)
  np.testing.assert_allclose(interleaved, half, atol=1e-6)
  # ... and differs from treating interleaved weights as rotate-half ones.
  assert not np.allclose(interleaved, rope.Rope(rope_cfg(interleave=False), 8)(x, positions),
                         atol=1e-3)


def test_attention_factor_scales_cos_and_sin():
  cfg = rope_cfg(scaling="yarn", factor=16.0)
  x = jax.random.normal(jax.random.key(2), (1, 4, 2, 8))
  positions = jnp.arange(4)[None]
  scaled = rope.Rope(cfg, 8)(x, positions)
  norms = jnp.linalg.norm(scaled, axis=-1) / jnp.linalg.norm(x, axis=-1)
  np.testing.assert_allclose(norms, 0.1 * math.log(16.0) + 1.0, rtol=1e-5)
