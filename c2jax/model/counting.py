"""Parameter counts from abstract shapes (`jax.eval_shape`): exact and allocation-free."""

from __future__ import annotations

import math

import jax

from c2jax.model import config as model_config


def abstract_params(cfg):
  """The parameter tree as ShapeDtypeStructs, for any model size."""
  from c2jax import model  # the public face; imported lazily to keep this module light

  model_config.validate(cfg)
  return jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))


def count_params(cfg) -> dict:
  """total_params, and active_params: the parameters one token uses.

  A token uses every parameter except the routed experts it is not sent to, so each
  routed-expert tensor counts with weight num_experts_per_tok / num_experts.
  """
  shapes = abstract_params(cfg)
  total = active = 0.0
  by_group: dict[str, int] = {}
  routed_fraction = cfg.moe.num_experts_per_tok / cfg.moe.num_experts
  for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
    keys = [getattr(k, "key", str(k)) for k in path]
    n = math.prod(leaf.shape)
    total += n
    active += n * routed_fraction if "experts" in keys else n
    by_group[keys[0]] = by_group.get(keys[0], 0) + n
  return {
      "variant": cfg.name,
      "total_params": int(total),
      "active_params": int(round(active)),
      "total_billions": round(total / 1e9, 3),
      "active_billions": round(active / 1e9, 3),
      "params_by_group": by_group,
  }
