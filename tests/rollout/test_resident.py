"""c2jax.rollout.resident: an engine's weights by tensor group, by hand on `tiny`."""

import functools

import jax
import numpy as np

from c2jax import model
from c2jax.model import config as model_config
from c2jax.rollout import resident


def test_tiny_weights_by_group_by_hand():
  cfg = model_config.defaults()
  cfg.num_mtp_layers = 1
  params = jax.eval_shape(functools.partial(model.init, cfg), jax.random.key(0))
  groups = resident.weight_groups(params)
  assert list(groups) == [g for g in resident.GROUPS if g in groups]
  assert set(groups) == set(resident.GROUPS)
  f32 = 4
  # One MoE layer: 8 experts of gate and up [64, 32] and down [32, 64], float32.
  assert groups["routed experts"]["bytes"] == 3 * 8 * 64 * 32 * f32
  assert groups["embedding"]["bytes"] == groups["lm_head"]["bytes"] == 8192 * 64 * f32
  assert groups["router"]["bytes"] == (64 * 8 + 8) * f32  # kernel and correction bias
  # Unsharded: every device holds everything.
  assert all(g["bytes_per_device"] == g["bytes"] and g["dtypes"] == ["float32"]
             for g in groups.values())
  total = sum(int(np.prod(x.shape)) * f32 for x in jax.tree.leaves(params))
  assert sum(g["bytes"] for g in groups.values()) == total
  line = resident.describe(groups)
  assert line.startswith(f"weights {total / 1e6:.2f} MB per device (embedding ")
  assert "routed experts 196.61 KB float32" in line
