"""What an engine's weights hold, by tensor group: bytes (total and per device) and dtypes.

    groups = weight_groups(engine.param_like())
    # {'routed experts': {'bytes': ..., 'bytes_per_device': ..., 'dtypes': ['bfloat16']}, ...}

Groups, by parameter path (model.init's tree): embedding, attention, dense mlp, router,
shared experts, routed experts, lm_head, mtp (every MTP module), norms (the scales). Per
device is a leaf's shard under its sharding (the whole leaf when it has none or is
replicated), summed over the group: what each device of the engine's mesh holds.
`c2jax serve` prints the groups at start and /health returns them; `c2jax plan` sums them
for an actor's engine. Bytes are device bytes: int4 values count half a byte.

An engine may hold its routed experts quantised (engine.weights_quant: 'fp8' block-scaled,
'int8' or 'int4' weight-only; kernels.weight_quant): `quantize_resident` turns those leaves
of a (placed) tree into WeightQuant values + scales, the values sharded as their weight,
the scales likewise wherever their blocked dimensions divide by the mesh axes;
`abstract_resident` does the same to ShapeDtypeStructs for plans. The MoE dispatch then
dequantises them a tile at a time (c2jax.model.moe_dispatch.grouped_experts).
"""

from __future__ import annotations

import functools
import math

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from c2jax_kernels import weight_quant
from c2jax_kernels.weight_quant import formats as quant_formats

from c2jax.model import moe

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
    sharding = getattr(leaf, "sharding", None)
    shard = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
    entry["bytes"] += weight_quant.resident_bytes(leaf.shape, leaf.dtype)
    entry["bytes_per_device"] += weight_quant.resident_bytes(shard, leaf.dtype)
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




def _keys(path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def quantizes(keys: tuple[str, ...]) -> bool:
  """Whether engine.weights_quant quantises the leaf at this path (a routed expert's)."""
  return moe.is_routed_expert(keys)


def check_weights_quant(weights_quant: str, key: str = "weights_quant") -> str:
  if weights_quant not in weight_quant.WEIGHT_QUANT_CHOICES:
    raise ValueError(f"{key} = {weights_quant!r}; choose one of "
                     f"{weight_quant.WEIGHT_QUANT_CHOICES}.")
  return weights_quant


def scale_sharding(sharding, shape, block):
  """The scales' sharding: the weight's spec, less the mesh axes that do not divide a
  blocked dimension (those stay whole on every device)."""
  if not isinstance(sharding, NamedSharding):
    return sharding
  scales = quant_formats.scale_shape(shape, block)
  sizes = dict(sharding.mesh.shape)
  spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
  for dim, entry in enumerate(spec):
    axes = entry if isinstance(entry, tuple) else (entry,) if entry else ()
    if axes and scales[dim] % math.prod(sizes[a] for a in axes):
      spec[dim] = None
  return NamedSharding(sharding.mesh, P(*spec))


def _map_experts(params, weights_quant: str, quantize_leaf):
  """`params` with each routed expert's leaf w replaced by quantize_leaf(w, what,
  shardings): `what` names it, `shardings` is a WeightQuant of the values' and scales'
  NamedShardings (None when w has none)."""
  check_weights_quant(weights_quant)
  if weights_quant == "none":
    held = held_schemes(params)
    if held:
      raise ValueError(f"the parameters hold routed experts quantised ({'/'.join(held)}) but "
                       "weights_quant = 'none'; give the engine that weights_quant, or load "
                       "the checkpoint dequantised (c2jax.hf.load without weights_quant).")
    return params
  scheme = weight_quant.SCHEMES[weights_quant]

  def leaf(path, w):
    keys = _keys(path)
    if weight_quant.is_quantized(w):  # held as a checkpoint stores it (hf.load)
      if w.scheme != weights_quant:
        raise ValueError(f"{'/'.join(keys)} is held as {w.scheme} but weights_quant = "
                         f"{weights_quant!r}; load the checkpoint with the engine's "
                         "weights_quant (c2jax.hf.load(weights_quant=)).")
      return w
    if not quantizes(keys):
      return w
    what, sharding = "/".join(keys), getattr(w, "sharding", None)
    block = quant_formats.block_of(scheme, *w.shape[-2:], what)
    shardings = None
    if isinstance(sharding, NamedSharding):
      shardings = weight_quant.WeightQuant(
          sharding, scale_sharding(sharding, w.shape, block), weights_quant, block)
    return quantize_leaf(w, what, shardings)

  return jax.tree_util.tree_map_with_path(leaf, params, is_leaf=weight_quant.is_quantized)


def plain_like(params):
  """ShapeDtypeStructs (with shardings) of `params` as an engine takes new versions of
  them: a leaf held quantised (WeightQuant) as its full-precision weight, in the dtype of
  the tree's other floating leaves (the dtype its checkpoint dequantises into)."""
  is_held = weight_quant.is_quantized
  floats = [jax.numpy.dtype(x.dtype) for x in jax.tree.leaves(params, is_leaf=is_held)
            if not is_held(x) and jax.numpy.issubdtype(x.dtype, jax.numpy.floating)]
  # The most common (ties: by name, so every process agrees).
  dtype = min(set(floats), key=lambda d: (-floats.count(d), d.name), default=jax.numpy.dtype(
      "float32"))

  def like(x):
    if is_held(x):
      return jax.ShapeDtypeStruct(x.shape, dtype, sharding=getattr(x.values, "sharding", None))
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
  return jax.tree.map(like, params, is_leaf=is_held)


def held_schemes(params) -> list[str]:
  """The quantisation schemes of the leaves `params` already holds quantised (a released
  checkpoint read as stored); empty for a full-precision tree."""
  return sorted({leaf.scheme for leaf in jax.tree.leaves(params, is_leaf=weight_quant.is_quantized)
                 if weight_quant.is_quantized(leaf)})


def quantize_resident(params, weights_quant: str):
  """`params` (model.init's stacked tree of arrays, placed or not) with the routed experts
  quantised by `weights_quant` ('none': unchanged), one leaf at a time (the peak is one
  leaf's quantised copy beside the tree), each born with its weight's sharding."""
  def quantize(w, what, shardings):
    return jax.jit(functools.partial(weight_quant.quantize_weight, scheme_name=weights_quant,
                                     what=what), out_shardings=shardings)(w)
  return _map_experts(params, weights_quant, quantize)


def abstract_resident(params, weights_quant: str):
  """quantize_resident on ShapeDtypeStructs (with or without shardings): the tree an
  engine holding `weights_quant` weights compiles against (plans)."""
  def abstract(w, what, shardings):
    return weight_quant.abstract_quantized(
        w.shape, weights_quant, sharding=shardings and shardings.values,
        scale_sharding=shardings and shardings.scales, what=what)
  return _map_experts(params, weights_quant, abstract)
