"""Expert parallelism: routed experts sharded over mesh axes, tokens moved by all-to-all.

Decoupled from tensor parallelism, as in the Composer 2 report: the stacked expert weights
[E, ...] are split over the mesh axes that the logical 'expert' axis maps to (the EP
group, of size N), tokens stay split over the batch-like axes. Inside `jax.shard_map`
every shard, for its local tokens:
  1. buckets each (token, k) copy by the shard owning its expert (expert // E_local) into
     a fixed [N, C, D] send buffer, in token order; copies past a bucket's capacity C are
     dropped (and counted);
  2. exchanges buffers with `lax.all_to_all` (static shapes: `ragged_all_to_all` has no
     CPU implementation), optionally as MXFP8 (E4M3 values + E8M0 scale per 32 features,
     dequantised by the receiver to the model dtype);
  3. runs its E_local experts on the received rows with a plain MoE dispatch function
     (c2jax.model.moe_dispatch.DISPATCH: sort by local expert, grouped matmul);
  4. sends the outputs back with a second all-to-all (model dtype) and combines them with
     the float32 gate weights, as the single-device dispatches do.
Capacity C is per (source, destination) pair. The default (capacity_factor 0) is the
no-drop worst case, every local copy to one shard: C = T_local * K. A factor f > 0 gives
C = min(T_local * K, ceil(f * T_local * K / N)); a dropped copy contributes zero to its
token's output and is counted in the returned `dropped` (summed over the whole mesh).

Routing (and with it expert loads, router replay and the correction-bias statistics)
happens before this module, on the globally sharded arrays, so it needs no collective.

Shapes: T tokens, K experts per token, D hidden, E experts, N EP shards, C capacity per
(source, destination) pair, M = T * K token copies, S = N * C buffer slots.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import c2jax_kernels as kernels

MODES = ("auto", "off")  # config.moe.expert_parallel
# config.moe.ep_dispatch_quant -> block format of the dispatched tokens (None: model dtype).
DISPATCH_FORMATS: dict[str, str | None] = {"none": None, "mxfp8": "mxfp8_e4m3"}


@dataclasses.dataclass(frozen=True)
class ExpertParallelPlan:
  """Where experts and tokens live on the ambient mesh.

  expert_axes: mesh axes the expert dimension is split over (the all-to-all group).
  token_axes: mesh axes the flat token dimension is split over: the logical 'batch' and
    'length' axes' mesh axes, plus any expert axis they lack (each EP shard must own
    distinct tokens, or it would send duplicates).
  """
  mesh: jax.sharding.AbstractMesh
  expert_axes: tuple[str, ...]
  token_axes: tuple[str, ...]

  @property
  def num_shards(self) -> int:
    return math.prod(self.mesh.shape[axis] for axis in self.expert_axes)

  @property
  def token_ways(self) -> int:
    return math.prod(self.mesh.shape[axis] for axis in self.token_axes)


def _mesh_axes_of(logical_names: tuple[str, ...]) -> list[str]:
  """Mesh axes the active flax logical rules give these names, in order, deduplicated."""
  axes = []
  for entry in nn.logical_to_mesh_axes(logical_names):
    for axis in (entry if isinstance(entry, tuple) else (entry,)):
      if axis is not None and axis not in axes:
        axes.append(axis)
  return axes


def plan_from_context() -> ExpertParallelPlan | None:
  """The plan for the ambient mesh (`jax.set_mesh`) and flax logical-axis rules, or None
  when there is no mesh or 'expert' maps to no mesh axes of total size > 1."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return None
  sizes = dict(mesh.shape)
  # Size-1 axes change nothing; leaving them out keeps the collectives minimal.
  expert_axes = tuple(a for a in _mesh_axes_of(("expert",)) if sizes.get(a, 1) > 1)
  if not expert_axes:
    return None
  missing = [a for a in expert_axes if a not in sizes]
  if missing:
    raise ValueError(f"expert parallelism: the logical axis rules map 'expert' to mesh axes "
                     f"{missing} that the ambient mesh {tuple(sizes)} lacks; fix "
                     "config.parallel.rules.")
  token_axes = [a for a in _mesh_axes_of(("batch", "length")) if sizes.get(a, 1) > 1]
  token_axes += [a for a in expert_axes if a not in token_axes]
  return ExpertParallelPlan(mesh, expert_axes, tuple(token_axes))


def capacity(tokens_per_shard: int, top_k: int, num_shards: int,
             capacity_factor: float) -> int:
  """Slots per (source, destination) pair; factor 0 means no drops (T_local * K)."""
  worst = tokens_per_shard * top_k
  if capacity_factor < 0:
    raise ValueError(f"capacity_factor = {capacity_factor}; use 0 (no drops) or > 0.")
  if capacity_factor == 0:
    return worst
  return max(1, min(worst, math.ceil(capacity_factor * worst / num_shards)))


def _vary(array, axes):
  """`array`, replicated over the manual mesh `axes`, typed as varying over them."""
  if hasattr(jax.lax, "pcast"):
    return jax.lax.pcast(array, axes, to="varying")
  return jax.lax.pvary(array, axes)  # older jax spells the cast this way


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _quantized_all_to_all(buffer_SxD, axis_names, fmt):
  """all_to_all of block-quantised rows, dequantised on arrival to buffer_SxD.dtype.

  The gradient is straight-through: the cotangent travels back unquantised (the exchange
  is its own transpose), so quantisation noise never reaches the backward pass.
  """
  q = kernels.quantize(buffer_SxD, fmt, axis=-1)
  exchange = functools.partial(jax.lax.all_to_all, axis_name=axis_names, split_axis=0,
                               concat_axis=0, tiled=True)
  q = dataclasses.replace(q, values=exchange(q.values), scales=exchange(q.scales))
  return kernels.dequantize(q, dtype=buffer_SxD.dtype)


def _quantized_all_to_all_fwd(buffer_SxD, axis_names, fmt):
  return _quantized_all_to_all(buffer_SxD, axis_names, fmt), None


def _quantized_all_to_all_bwd(axis_names, fmt, _, cotangent_SxD):
  del fmt
  return (jax.lax.all_to_all(cotangent_SxD, axis_names, 0, 0, tiled=True),)


_quantized_all_to_all.defvjp(_quantized_all_to_all_fwd, _quantized_all_to_all_bwd)


def dispatch_combine_local(x_TxD, weights_TxK, indices_TxK, valid_T, local_experts, *,
                           axis_names: tuple[str, ...], token_axes: tuple[str, ...],
                           num_shards: int, capacity: int,
                           local_dispatch: Callable, quant: str = "none",
                           dispatch_format: str | None = None):
  """One shard's side of EP (call inside shard_map; `axis_names` are the expert axes,
  `token_axes` those the tokens are split over, a superset).

  x_TxD, weights_TxK (float32), indices_TxK (global expert ids): this shard's tokens;
  valid_T: False rows (padding added by `moe_forward`) are neither sent nor counted;
  local_experts: pytree of [E_local, ...] arrays, this shard's experts, which hold the
  global experts [shard * E_local, (shard + 1) * E_local);
  local_dispatch: a DISPATCH function (x, weights, indices, experts, quant=) -> y.
  Returns (y_TxD in x's dtype, dropped: int32 copies dropped on this shard).
  """
  num_tokens, top_k = indices_TxK.shape
  experts_per_shard = jax.tree.leaves(local_experts)[0].shape[0]
  # Under shard_map's varying-axes typing the weights vary over the expert axes only, but
  # their gradient (from this shard's tokens) varies over the token axes too; marking them
  # varying up front makes the custom-VJP kernels type-check, and the transpose of this
  # cast sums the weight gradient over the token shards.
  data_axes = tuple(axis for axis in token_axes if axis not in axis_names)
  if data_axes:
    local_experts = jax.tree.map(functools.partial(_vary, axes=data_axes), local_experts)
  num_slots = num_shards * capacity

  expert_M = indices_TxK.reshape(-1)
  # Destination num_shards (one past the last) marks a copy that is not sent at all.
  dest_M = jnp.where(jnp.repeat(valid_T, top_k), expert_M // experts_per_shard, num_shards)
  # Rank of each copy within its destination bucket, in token order (stable sort).
  order_M = jnp.argsort(dest_M, stable=True)
  # Counts as a one-hot sum and the slot's expert by scatter, not a bincount or a
  # gather through copy_S: the TPU compiler offloads those small int scatter-adds and
  # gathers to the SparseCore, where its cost model has no estimate.
  counts_N1 = jax.nn.one_hot(dest_M, num_shards + 1, dtype=jnp.int32).sum(0)
  starts_N1 = jnp.cumsum(counts_N1) - counts_N1
  rank_sorted_M = jnp.arange(dest_M.shape[0]) - starts_N1[dest_M[order_M]]
  rank_M = jnp.zeros_like(rank_sorted_M).at[order_M].set(rank_sorted_M)
  sent_M = dest_M < num_shards
  keep_M = sent_M & (rank_M < capacity)
  dropped = jnp.sum(sent_M & ~keep_M).astype(jnp.int32)
  # Slot num_slots is a sink: dropped and unsent copies write there, reads give zeros.
  slot_M = jnp.where(keep_M, dest_M * capacity + rank_M, num_slots)

  # Which copy fills each send slot (num_tokens * top_k = none), then gather its token:
  # copies are token-major, copy m belongs to token m // top_k.
  copy_S = jnp.full((num_slots,), expert_M.shape[0], jnp.int32).at[slot_M].set(
      jnp.arange(expert_M.shape[0], dtype=jnp.int32), mode="drop")
  filled_S = copy_S < expert_M.shape[0]
  x_ext_TxD = jnp.concatenate([x_TxD, jnp.zeros((1, x_TxD.shape[1]), x_TxD.dtype)])
  send_SxD = jnp.take(x_ext_TxD, jnp.where(filled_S, copy_S // top_k, num_tokens), axis=0)
  # Empty slots name expert E_local, which no local dispatch computes (zero rows).
  local_expert_S = jnp.full((num_slots,), experts_per_shard, jnp.int32).at[slot_M].set(
      (expert_M % experts_per_shard).astype(jnp.int32), mode="drop")

  exchange = functools.partial(jax.lax.all_to_all, axis_name=axis_names, split_axis=0,
                               concat_axis=0, tiled=True)
  if dispatch_format is None:
    recv_SxD = exchange(send_SxD)
  else:
    recv_SxD = _quantized_all_to_all(send_SxD, axis_names, dispatch_format)
  recv_expert_S = exchange(local_expert_S)

  # Each received row is one copy with gate weight 1: the sender applies the real one.
  ones_Sx1 = jnp.ones((num_slots, 1), jnp.float32)
  out_SxD = local_dispatch(recv_SxD, ones_Sx1, recv_expert_S[:, None], local_experts,
                           quant=quant)
  back_SxD = exchange(out_SxD)

  back_ext_SxD = jnp.concatenate([back_SxD, jnp.zeros((1, back_SxD.shape[1]),
                                                       back_SxD.dtype)])
  out_TxKxD = jnp.take(back_ext_SxD, slot_M, axis=0).reshape(num_tokens, top_k, -1)
  y_TxD = jnp.einsum("tkd,tk->td", out_TxKxD.astype(jnp.float32),
                     weights_TxK * keep_M.reshape(num_tokens, top_k))
  return y_TxD.astype(x_TxD.dtype), dropped


def moe_forward(x_TxD, weights_TxK, indices_TxK, experts, plan: ExpertParallelPlan, *,
                local_dispatch: Callable, quant: str = "none",
                capacity_factor: float = 0.0, dispatch_quant: str = "none"):
  """Routed-expert output of global tokens under `plan`: (y_TxD, dropped int32 scalar).

  experts: pytree of [E, ...] arrays (e.g. moe_dispatch.ExpertWeights); E must divide by
  plan.num_shards. T need not divide by plan.token_ways: rows are padded and not sent.
  """
  if dispatch_quant not in DISPATCH_FORMATS:
    raise ValueError(f"ep_dispatch_quant = {dispatch_quant!r}; choose one of "
                     f"{sorted(DISPATCH_FORMATS)} (config.moe.ep_dispatch_quant).")
  num_experts = jax.tree.leaves(experts)[0].shape[0]
  num_shards = plan.num_shards
  if num_experts % num_shards:
    raise ValueError(
        f"expert parallelism over mesh axes {plan.expert_axes} ({num_shards} shards) needs "
        f"moe.num_experts = {num_experts} to divide by {num_shards}; change "
        "config.parallel.mesh, or set config.model.moe.expert_parallel = 'off'.")
  num_tokens, top_k = indices_TxK.shape
  pad = -num_tokens % plan.token_ways
  valid_T = jnp.arange(num_tokens + pad) < num_tokens
  pad_rows = lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
  body = functools.partial(
      dispatch_combine_local, axis_names=plan.expert_axes, token_axes=plan.token_axes,
      num_shards=num_shards,
      capacity=capacity((num_tokens + pad) // plan.token_ways, top_k, num_shards,
                        capacity_factor),
      local_dispatch=local_dispatch, quant=quant,
      dispatch_format=DISPATCH_FORMATS[dispatch_quant])

  def shard_body(*args):
    y_TxD, dropped = body(*args)
    return y_TxD, jax.lax.psum(dropped, plan.token_axes)

  tokens = P(plan.token_axes)
  y_TxD, dropped = jax.shard_map(
      shard_body, mesh=plan.mesh,
      in_specs=(tokens, tokens, tokens, tokens,
                jax.tree.map(lambda _: P(plan.expert_axes), experts)),
      # Pallas kernels inside carry no varying-axes annotations; skip that check.
      out_specs=(tokens, P()), check_vma=False)(pad_rows(x_TxD), pad_rows(weights_TxK),
                               pad_rows(indices_TxK), valid_T, experts)
  return y_TxD[:num_tokens], dropped


def token_axes_from_context() -> tuple[str, ...]:
  """Mesh axes of size > 1 that split tokens (the 'batch' and 'length' rules) under the
  ambient mesh; () with no mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return ()
  sizes = dict(mesh.shape)
  return tuple(a for a in _mesh_axes_of(("batch", "length")) if sizes.get(a, 1) > 1)


def token_local_forward(x_TxD, weights_TxK, indices_TxK, experts, token_axes, *,
                        local_dispatch: Callable, quant: str = "none"):
  """Routed-expert output without expert parallelism, each token shard dispatching its own
  rows to every expert inside shard_map (the experts gathered whole, as FSDP does anyway).
  For Pallas kernels compiled by Mosaic: a Mosaic custom call cannot be partitioned by
  XLA, so it must see per-device arrays. T need not divide by the shards (rows padded)."""
  mesh = jax.sharding.get_abstract_mesh()
  ways = math.prod(dict(mesh.shape)[a] for a in token_axes)
  num_tokens = x_TxD.shape[0]
  pad = -num_tokens % ways
  pad_rows = lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
  tokens = P(token_axes)
  y_TxD = jax.shard_map(
      lambda x, w, i, e: local_dispatch(x, w, i, e, quant=quant), mesh=mesh,
      in_specs=(tokens, tokens, tokens, jax.tree.map(lambda _: P(), experts)),
      out_specs=tokens, check_vma=False)(
          pad_rows(x_TxD), pad_rows(weights_TxK), pad_rows(indices_TxK), experts)
  return y_TxD[:num_tokens]
