"""What an engine's weights hold, by tensor group: bytes (total and per device) and dtypes.

    groups = weight_groups(engine.param_like())
    # {'routed experts': {'bytes': ..., 'bytes_per_device': ..., 'dtypes': ['bfloat16']}, ...}

Groups, by parameter path (model.init's tree): embedding, attention, dense mlp, router,
shared experts, routed experts, lm_head, mtp (every MTP module), norms (the scales). Per
device is a leaf's shard under its sharding (the whole leaf when it has none or is
replicated), summed over the group: what each device of the engine's mesh holds.
`c2jax serve` prints the groups at start and /health returns them; `c2jax plan` sums them
for an actor's engine.
"""

from __future__ import annotations

import math

import jax

GROUPS = ("embedding", "attention", "dense mlp", "router", "shared experts",
          "routed experts", "lm_head", "mtp", "norms")


def group_of(keys: tuple[str, ...]) -> str:
  """The tensor group of a parameter path (its dict keys, outermost first)."""
  if keys[0] == "mtp_layers":
    return "mtp"
  if keys[0] == "embed":
    return "embedding"
  if keys[0] == "lm_head":
    return "lm_head"
  for key, group in (("experts", "routed experts"), ("shared", "shared experts"),
                     ("router", "router"), ("attn", "attention"), ("mlp", "dense mlp")):
    if key in keys:
      return group
  return "norms"


def weight_groups(params) -> dict[str, dict]:
  """{group: {'bytes', 'bytes_per_device', 'dtypes'}} over the groups present, in GROUPS'
  order, for a tree of arrays or ShapeDtypeStructs (with or without shardings)."""
  totals: dict[str, dict] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    keys = tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
    entry = totals.setdefault(group_of(keys), {"bytes": 0, "bytes_per_device": 0,
                                               "dtypes": set()})
    itemsize = jax.numpy.dtype(leaf.dtype).itemsize
    sharding = getattr(leaf, "sharding", None)
    shard = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
    entry["bytes"] += math.prod(leaf.shape) * itemsize
    entry["bytes_per_device"] += math.prod(shard) * itemsize
    entry["dtypes"].add(jax.numpy.dtype(leaf.dtype).name)
  return {group: {**totals[group], "dtypes": sorted(totals[group]["dtypes"])}
          for group in GROUPS if group in totals}


def describe(groups: dict[str, dict]) -> str:
  """One line: per-device total, then each group's per-device bytes and dtypes."""
  per_device = sum(g["bytes_per_device"] for g in groups.values())
  parts = ", ".join(f"{name} {_size(g['bytes_per_device'])} {'/'.join(g['dtypes'])}"
                    for name, g in groups.items())
  return f"weights {_size(per_device)} per device ({parts})"


def _size(num_bytes: int) -> str:
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
    if num_bytes >= scale:
      return f"{num_bytes / scale:.2f} {unit}"
  return f"{num_bytes} B"
