"""Shared tiny model configs, parameters and jitted apply functions for tests/model.

Session-scoped so every test file reuses the same compiled functions (CPU compiles cost
seconds each). Parameters are drawn in numpy on the shapes of `jax.eval_shape(model.init)`
(compiling `model.init` itself costs more than a forward pass; test_transformer checks it
once), with non-unit norm scales and non-zero correction biases so those are exercised.
`init_std` 0.1 makes attention patterns and routing decisive, so numerical comparisons at
1e-4 are meaningful rather than trivially small.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import model
from c2jax.model import variants

VOCAB = 256


def tiny_cfg(**overrides):
  """The `tiny` variant with a small vocab; 3 layers (1 dense + 2 MoE) by default."""
  fields = dict(vocab_size=VOCAB, init_std=0.1, num_layers=3, first_k_dense=1)
  fields.update(overrides)
  return variants.get("tiny", **fields)


# MLA with YaRN (mscale_all_dim set) and interleaved rope, as DeepSeek-V3 / Kimi.
MLA_OVERRIDES = dict(rope=dict(scaling="yarn", factor=8.0, original_max_position=64,
                               mscale=1.0, mscale_all_dim=1.0, interleave=True))
# GQA with q/k norm and rotate-half rope, softmax router without shared experts (Qwen3).
GQA_OVERRIDES = dict(attention="gqa", num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True,
                     rope=dict(theta=1e6, interleave=False),
                     moe=dict(router="softmax", num_shared_experts=0, norm_topk_prob=False))
ATTENTION_CASES = {"mla": MLA_OVERRIDES, "gqa": GQA_OVERRIDES}


def draw_params(shapes, init_std: float, seed: int = 0):
  """Arrays of `shapes` (a ShapeDtypeStruct tree): norms 1 + N(0, 0.1), correction biases
  N(0, 0.1), kernels N(0, init_std)."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    noise = rng.standard_normal(leaf.shape)
    value = {"scale": 1 + 0.1 * noise, "correction_bias": 0.1 * noise}.get(
        path[-1].key, init_std * noise)
    return jnp.asarray(value, leaf.dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)


def random_params(cfg, seed: int = 0):
  return draw_params(jax.eval_shape(lambda: model.init(cfg, jax.random.key(0))),
                     cfg.init_std, seed)


class Model:
  """A config, its parameters and a jitted `model.apply` bound to them."""

  def __init__(self, cfg, seed: int = 0):
    self.cfg = cfg
    self.params = random_params(cfg, seed)
    self.apply = jax.jit(functools.partial(model.apply, cfg))


@pytest.fixture(scope="session", params=sorted(ATTENTION_CASES))
def tiny_model(request) -> Model:
  return Model(tiny_cfg(**ATTENTION_CASES[request.param]))


@pytest.fixture(scope="session")
def mla_model() -> Model:
  return Model(tiny_cfg(**MLA_OVERRIDES))
