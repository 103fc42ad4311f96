"""c2jax.model: the DeepSeek-V3 / Kimi-K2.5 / Qwen3-MoE family as pure Flax Linen.

    params = model.init(cfg, jax.random.key(0))          # plain arrays, no 'params' wrapper
    logits = model.forward(cfg, params, tokens_BxL)      # float32 [B, L, V]
    logits, aux, cache = model.apply(cfg, params, tokens_BxL, positions_BxL=...,
                                     segment_ids_BxL=..., routing=..., cache=...)

`param_axes(cfg)` / `cache_axes(cfg)` give the logical axis names of every parameter /
cache array (mapped to a mesh by c2jax.parallel); `trainable_mask(params)` marks what the
optimizer updates (everything but the MoE correction biases, MTP layers' included). The
multi-token-prediction modules (cfg.num_mtp_layers > 0) live at params['mtp_layers'];
c2jax.model.mtp applies them and computes their training loss.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from c2jax.model import mtp
from c2jax.model.transformer import (REMAT_POLICIES, Transformer, cache_axes,
                                     has_unstacked_layers, init_cache, lm_head,
                                     projection_shapes, stack_layers, store_projections,
                                     transformer_for, unstack_layers)

__all__ = ["REMAT_POLICIES", "Transformer", "abstract_params", "apply", "cache_axes",
           "forward", "head", "has_unstacked_layers", "init", "init_cache", "param_axes",
           "projection_shapes", "stack_layers", "store_projections", "trainable_mask",
           "transformer_for", "unstack_layers"]

_NOT_TRAINED = frozenset({"correction_bias"})


def _init_boxed(cfg, rng):
  tokens_1x1 = jnp.zeros((1, 1), jnp.int32)
  params = Transformer(cfg).init(rng, tokens_1x1)["params"]
  if cfg.num_mtp_layers:
    # Its own stream, so enabling MTP leaves the main model's initial values unchanged.
    params = {**params, mtp.PARAMS_KEY: mtp.init_boxed(cfg, jax.random.fold_in(rng, 1))}
  return params


def init(cfg, rng: jax.Array) -> dict:
  """Fresh parameters (HF-style normal(init_std) kernels, unit norms, zero biases).

  With cfg.num_mtp_layers > 0 the MTP modules are included as params['mtp_layers'].
  Works under `jax.eval_shape` for any size, e.g. to count a 1T model's parameters.
  """
  return nn.unbox(_init_boxed(cfg, rng))


def param_axes(cfg) -> dict:
  """PartitionSpecs of logical axis names, one per parameter (no allocation)."""
  return nn.get_partition_spec(jax.eval_shape(lambda: _init_boxed(cfg, jax.random.key(0))))


def abstract_params(cfg) -> tuple[dict, dict]:
  """(shapes, axes): init's tree as ShapeDtypeStructs, as `jax.eval_shape` of init gives it,
  and param_axes(cfg), from one trace of the model's init (no allocation). A job's start
  needs both; each trace of init is a few tenths of a second even at tiny size."""
  boxed, shapes = jax.eval_shape(
      lambda: (lambda tree: (tree, nn.unbox(tree)))(_init_boxed(cfg, jax.random.key(0))))
  return shapes, nn.get_partition_spec(boxed)


def apply(cfg, params, tokens_BxL, **kwargs):
  """(logits_BxLxV float32, aux, new_cache); kwargs as Transformer.__call__. `params`
  may also be unstack_layers(params) (per-layer weight arrays, what decode engines keep,
  maybe with projection kernels in registered forms, store_projections): the layers then
  run as a Python loop, same numerics."""
  return transformer_for(cfg, params).apply({"params": params}, tokens_BxL, **kwargs)


def forward(cfg, params, tokens_BxL, **kwargs) -> jax.Array:
  """float32 logits [B, L, V] for int32 tokens [B, L]."""
  return apply(cfg, params, tokens_BxL, **kwargs)[0]


def head(cfg, params, hidden_BxLxD) -> jax.Array:
  """float32 logits [B, L, V] from the final-normed hidden state that apply(..., head=False)
  returns: the model's own lm_head module (quantised or not), so logits of a few picked
  positions equal those of apply's full [B, L, V] logits at them."""
  return lm_head(cfg, None).apply({"params": params["lm_head"]}, hidden_BxLxD)


def trainable_mask(params) -> dict:
  """Same tree as params: False for leaves the optimizer must not touch."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: not any(getattr(k, "key", None) in _NOT_TRAINED for k in path), params)
