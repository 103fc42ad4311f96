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
  """total_params and active_params (the parameters one token uses) of the MAIN model,
  and mtp_params, the multi-token-prediction modules (cfg.num_mtp_layers), apart:
  they are not used to score tokens, so (as DeepSeek-V3's 671B) totals leave them out.

  A token uses every parameter except the routed experts it is not sent to, so each
  routed-expert tensor counts with weight num_experts_per_tok / num_experts.
  """
  from c2jax.model import mtp

  shapes = abstract_params(cfg)
  total = active = mtp_total = 0
  by_group: dict[str, int] = {}
  routed_fraction = cfg.moe.num_experts_per_tok / cfg.moe.num_experts
  for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
    keys = [getattr(k, "key", str(k)) for k in path]
    n = math.prod(leaf.shape)
    by_group[keys[0]] = by_group.get(keys[0], 0) + n
    if keys[0] == mtp.PARAMS_KEY:
      mtp_total += n
      continue
    total += n
    active += n * routed_fraction if "experts" in keys else n
  return {
      "variant": cfg.name,
      "total_params": int(total),
      "active_params": int(round(active)),
      "total_billions": round(total / 1e9, 3),
      "active_billions": round(active / 1e9, 3),
      "mtp_params": int(mtp_total),
      "params_by_group": by_group,
  }
