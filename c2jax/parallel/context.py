"""Context parallelism (CP): one long sequence split over the mesh axes 'length' maps to.

Activations of shape [B, L, ...] are sharded along L over the CP axes (by the logical rule
for 'length', normally the `context` mesh axis), so CP rank r holds L / CP consecutive
slots of whatever layout the batch is in. Everything but attention works token by token
(nothing moves along the sequence); attention needs every key of the sequence.

Load-balanced layout. Causal attention makes late tokens cost more than early ones, so a
plain split gives the last rank most of the work. The batch is instead permuted along L
before it reaches the device: cut the sequence into 2*CP equal chunks; rank r holds chunks
r and 2*CP-1-r (early + late), so every rank attends over the same number of query-key
pairs. Positions, segment ids, targets and loss masks travel with their tokens, so RoPE
sees true positions and the loss (a masked sum over tokens) does not change. Whatever
puts a batch on the mesh applies it (the train loop's `device_batch` does):

    shards = context.num_shards(mesh, rules)            # 1 without CP
    batch = context.balance_batch(host_batch, shards)   # every [B, L, ...] array alike

Code that relates neighbouring slots (MTP's shifted tokens) needs the original order, so
it runs with contiguous shards (config.parallel.context_load_balance = False).

Attention under CP (`over_context`): inside `shard_map`, each rank all-gathers the small
per-token key inputs (MLA: the compressed KV latent and the shared rope key, 576 numbers a
token at Kimi-K2.5 scale; GQA: keys and values) plus the true positions and segment ids,
then attends with its local queries; the mask comes from positions, so it works in any
layout. The gradient of the gather is a reduce-scatter of the same size.

Shape legend: B batch, L global length, S = L / CP local length, CP context shards.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np

_BATCH_LENGTH = ("batch", "length")


def length_axes(mesh=None, rules=None) -> tuple[str, ...]:
  """Mesh axes that shard the 'length' of [batch, length, ...] activations, or () when
  they multiply to 1 (no context parallelism).

  Defaults: the ambient mesh (`jax.set_mesh`) and the active flax logical-axis rules, as
  seen while a model traces; pass a mesh (or a dict of axis sizes) and rules to ask on
  the host.
  """
  mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
  sizes = dict(getattr(mesh, "shape", mesh))
  rules = nn.get_logical_axis_rules() if rules is None else rules
  if not sizes or not rules:
    return ()
  axes = nn.logical_to_mesh_axes(_BATCH_LENGTH, rules)[1]
  axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  missing = [axis for axis in axes if axis not in sizes]
  if missing:
    raise ValueError(f"the logical-axis rules map 'length' to {missing}, which the mesh "
                     f"{sizes} does not have; fix config.parallel.rules.")
  return axes if math.prod(sizes[axis] for axis in axes) > 1 else ()


def num_shards(mesh=None, rules=None) -> int:
  """CP degree: the product of the sizes of `length_axes(mesh, rules)` (1 without CP)."""
  mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
  sizes = dict(getattr(mesh, "shape", mesh))
  return math.prod(sizes[axis] for axis in length_axes(sizes, rules))


def check_length(length: int, shards: int, balanced: bool) -> None:
  """Raises ValueError unless `length` splits evenly into the CP layout."""
  pieces = 2 * shards if balanced else shards
  if length % pieces:
    layout = (f"the load-balanced layout cuts it into 2 * {shards} chunks" if balanced
              else f"it is split over {shards} context shards")
    raise ValueError(f"sequence length {length} does not divide by {pieces}: {layout}. "
                     f"Use a multiple of {pieces} (config.train.seq_len) or change "
                     "config.parallel.mesh.context.")


def balanced_order(length: int, shards: int) -> np.ndarray:
  """int [L]: the original token index held at each slot of the load-balanced layout."""
  check_length(length, shards, balanced=True)
  chunks = np.arange(length).reshape(2 * shards, length // (2 * shards))
  return np.concatenate([np.concatenate([chunks[r], chunks[2 * shards - 1 - r]])
                         for r in range(shards)])


def to_balanced(x_BxLx_, shards: int):
  """Permutes axis 1 (length) of a numpy or jax array into the load-balanced layout."""
  return x_BxLx_[:, balanced_order(x_BxLx_.shape[1], shards)]


def from_balanced(x_BxLx_, shards: int):
  """Inverse of `to_balanced`: back to the original token order."""
  return x_BxLx_[:, np.argsort(balanced_order(x_BxLx_.shape[1], shards))]


def balance_batch(batch: Mapping[str, object], shards: int) -> dict:
  """Every [B, L, ...] array of a batch (tokens, positions, segment ids, targets, loss
  masks) permuted alike into the load-balanced layout."""
  return {key: to_balanced(value, shards) for key, value in batch.items()}


def over_context(attend: Callable, axes: Sequence[str], args: Sequence[jax.Array],
                 in_specs: Sequence[jax.sharding.PartitionSpec], gather: Sequence[bool],
                 out_spec: jax.sharding.PartitionSpec):
  """`attend(*args)` run per shard inside `shard_map` over the ambient mesh.

  `in_specs` / `out_spec` are the mesh layouts of the arguments and the result (each rank
  sees its block). Arguments flagged in `gather` are [B, S, ...] blocks that are first
  all-gathered along axis 1 over the CP `axes`, so `attend` sees them for the whole
  sequence [B, L, ...], in the shards' layout order; the others stay local. `attend` must
  not use sharding constraints or module state: it runs on per-device blocks.
  """
  if not (len(args) == len(in_specs) == len(gather)):
    raise ValueError(f"over_context got {len(args)} args, {len(in_specs)} in_specs and "
                     f"{len(gather)} gather flags; give one of each per argument.")
  axes = tuple(axes)

  def per_shard(*blocks):
    full = [jax.lax.all_gather(block, axes, axis=1, tiled=True) if wanted else block
            for block, wanted in zip(blocks, gather)]
    return attend(*full)

  return jax.shard_map(per_shard, in_specs=tuple(in_specs), out_specs=out_spec)(*args)
