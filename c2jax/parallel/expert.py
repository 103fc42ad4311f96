"""Expert parallelism: routed experts sharded over mesh axes, tokens moved by all-to-all.

Decoupled from tensor parallelism, as in the Composer 2 report: the stacked expert weights
[E, ...] are split over the mesh axes that the logical 'expert' axis maps to (the EP
group, of size N), tokens stay split over the batch-like axes. Inside `jax.shard_map`
every shard, for its local tokens:
  0. gathers its E_local experts' other dimensions over the token axes the weights are
     stored split over (FSDP), so the weights' gradient leaves by reduce-scatter rather
     than as a full-size all-reduce;
  1. buckets each (token, k) copy by the shard owning its expert (expert // E_local) into
     a fixed [N, C, D] send buffer, in token order; copies past a bucket's capacity C are
     dropped (and counted);
  2. exchanges buffers with `lax.all_to_all` (static shapes, the same on every platform),
     optionally as MXFP8 (E4M3 values + E8M0 scale per 32 features, dequantised by the
     receiver to the model dtype);
  3. runs its E_local experts on the received rows with a plain MoE dispatch function
     (c2jax.model.moe_dispatch.DISPATCH: sort by local expert, grouped matmul);
  4. sends the outputs back with a second all-to-all (model dtype) and combines them with
     the float32 gate weights, as the single-device dispatches do.
Without drops, `exchange='ragged'` (c2jax.parallel.expert_ragged) sends only the copies a
shard has for another instead of worst-case buckets; 'auto' picks it on TPU and GPU.
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
from c2jax.parallel import expert_ragged

MODES = ("auto", "off")  # config.moe.expert_parallel
# config.moe.ep_exchange: 'fixed' buckets of capacity C both ways (this module), 'ragged'
# only the rows each shard has for another (c2jax.parallel.expert_ragged; dropless), 'auto'
# ragged where the run is dropless and the platform has the collective (TPU, GPU).
EXCHANGES = ("auto", "fixed", "ragged")
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


def _weight_specs(experts, logical_axes, gather_axes: tuple[str, ...], mesh, first=None):
  """shard_map specs for the expert weights that keep each dimension split over the
  mesh axes in `gather_axes` that the logical rules give it (the weights' own FSDP
  sharding), and what to gather inside: a pytree like `experts` of
  (PartitionSpec, ((dim, axes), ...)).

  Gathering inside shard_map rather than on entry makes the weights' gradient a
  reduce-scatter over those axes instead of a full-size all-reduce followed by a slice.
  `first`: the spec entry of dimension 0 (the expert axes under EP), or None to treat
  dimension 0 like the others. Without `logical_axes`, nothing is gathered inside."""
  sizes = dict(mesh.shape)

  def leaf(weight, names):
    entries = [None] * weight.ndim
    gathers = []
    if names is not None:
      for dim, entry in enumerate(nn.logical_to_mesh_axes(names)):
        if dim == 0 and first is not None:
          continue
        axes = tuple(a for a in (entry if isinstance(entry, tuple) else (entry,))
                     if a in gather_axes and sizes.get(a, 1) > 1)
        if axes and weight.shape[dim] % math.prod(sizes[a] for a in axes) == 0:
          entries[dim] = axes
          gathers.append((dim, axes))
    if first is not None:
      entries[0] = first
    return P(*entries), tuple(gathers)

  if logical_axes is None:
    return jax.tree.map(lambda w: leaf(w, None), experts)
  return jax.tree.map(leaf, experts, logical_axes)


def _gather_weights(experts, weight_specs, varying_axes: tuple[str, ...] = ()):
  """Inside shard_map: each weight gathered along the dimensions `_weight_specs` kept
  split, then typed as varying over the rest of `varying_axes`.

  Under shard_map's varying-axes typing a weight replicated over an axis that splits the
  tokens gets a gradient that varies over it (one per token shard); marking it varying
  up front makes the custom-VJP kernels type-check, and the transpose of the cast sums
  the gradient over those shards."""
  def leaf(weight, spec):
    gathered = []
    for dim, axes in spec[1]:
      # Its transpose is a reduce-scatter, in the gradient's dtype (the compute dtype:
      # XLA reduces the other weights' gradients in it too).
      weight = jax.lax.all_gather(weight, axes, axis=dim, tiled=True)
      gathered += axes
    rest = tuple(a for a in varying_axes if a not in gathered)
    return _vary(weight, rest) if rest else weight
  return jax.tree.map(leaf, experts, weight_specs)


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
                           axis_names: tuple[str, ...], num_shards: int, capacity: int,
                           local_dispatch: Callable, quant: str = "none",
                           dispatch_format: str | None = None):
  """One shard's side of EP (call inside shard_map; `axis_names` are the expert axes).

  x_TxD, weights_TxK (float32), indices_TxK (global expert ids): this shard's tokens;
  valid_T: False rows (padding added by `moe_forward`) are neither sent nor counted;
  local_experts: pytree of [E_local, ...] arrays, this shard's experts (whole: gathered
  by `_gather_weights`), which hold the global experts [shard * E_local, (shard + 1) *
  E_local);
  local_dispatch: a DISPATCH function (x, weights, indices, experts, quant=) -> y.
  Returns (y_TxD in x's dtype, dropped: int32 copies dropped on this shard).
  """
  num_tokens, top_k = indices_TxK.shape
  experts_per_shard = jax.tree.leaves(local_experts)[0].shape[0]
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


def resolve_exchange(exchange: str, capacity_factor: float,
                     platform: str | None = None) -> str:
  """'fixed' | 'ragged' for config.moe.ep_exchange; 'ragged' drops nothing, so it needs
  capacity_factor 0. `platform`: the one the step compiles for (default: the mesh's)."""
  if exchange not in EXCHANGES:
    raise ValueError(f"ep_exchange = {exchange!r}; choose one of {list(EXCHANGES)} "
                     "(config.moe.ep_exchange).")
  if exchange == "auto":
    platform = platform or kernels.target_platform()
    return "ragged" if capacity_factor == 0 and platform in ("tpu", "gpu") else "fixed"
  if exchange == "ragged" and capacity_factor != 0:
    raise ValueError(f"ep_exchange = 'ragged' is dropless, but ep_capacity_factor = "
                     f"{capacity_factor}; set config.moe.ep_capacity_factor = 0 or "
                     "config.moe.ep_exchange = 'fixed'.")
  return exchange


def moe_forward(x_TxD, weights_TxK, indices_TxK, experts, plan: ExpertParallelPlan, *,
                local_dispatch: Callable, quant: str = "none",
                capacity_factor: float = 0.0, dispatch_quant: str = "none",
                logical_axes=None, exchange: str = "fixed",
                local_grouped: Callable | None = None):
  """Routed-expert output of global tokens under `plan`: (y_TxD, dropped int32 scalar).

  experts: pytree of [E, ...] arrays (e.g. moe_dispatch.ExpertWeights); E must divide by
  plan.num_shards. T need not divide by plan.token_ways: rows are padded and not sent.
  logical_axes: the weights' logical axis names (a pytree like `experts` of tuples, e.g.
  moe_dispatch.EXPERT_AXES). With them, dimensions the rules split over token axes (FSDP)
  enter the shard_map split and are gathered inside, so their gradient is
  reduce-scattered; without them, XLA gathers the weights on entry and their gradient is
  all-reduced over the token shards at full size.
  exchange: 'fixed' | 'ragged' | 'auto' (config.moe.ep_exchange, `resolve_exchange`).
  local_grouped: for the ragged exchange, the experts' grouped matmuls on rows grouped by
  expert, (rows, group_sizes, experts, quant=) -> outputs (moe_dispatch.grouped_experts).
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
  common = dict(axis_names=plan.expert_axes, num_shards=num_shards, quant=quant,
                dispatch_format=DISPATCH_FORMATS[dispatch_quant])
  if resolve_exchange(exchange, capacity_factor) == "ragged":
    if local_grouped is None:
      raise ValueError("the ragged exchange runs the experts on rows grouped by expert; "
                       "pass local_grouped (moe_dispatch.grouped_experts).")
    body = functools.partial(expert_ragged.dispatch_combine_ragged,
                             local_grouped=local_grouped, **common)
  else:
    body = functools.partial(dispatch_combine_local, capacity=capacity(
        (num_tokens + pad) // plan.token_ways, top_k, num_shards, capacity_factor),
                             local_dispatch=local_dispatch, **common)

  data_axes = tuple(a for a in plan.token_axes if a not in plan.expert_axes)
  weight_specs = _weight_specs(experts, logical_axes, data_axes, plan.mesh,
                               first=plan.expert_axes)

  def shard_body(x, weights, indices, valid, local_experts):
    local_experts = _gather_weights(local_experts, weight_specs, data_axes)
    y_TxD, dropped = body(x, weights, indices, valid, local_experts)
    return y_TxD, jax.lax.psum(dropped, plan.token_axes)

  tokens = P(plan.token_axes)
  y_TxD, dropped = jax.shard_map(
      shard_body, mesh=plan.mesh,
      in_specs=(tokens, tokens, tokens, tokens,
                jax.tree.map(lambda _, spec: spec[0], experts, weight_specs)),
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


def per_token_shard(fn: Callable, token_axes, rows: tuple, whole, whole_specs):
  """fn(*rows, whole) run by each token shard on its own rows inside shard_map: `rows` are
  arrays of T rows split over `token_axes` (T need not divide by the shards: rows are
  padded with zeros, and the padding is cut from the [T, ...] result), `whole` a pytree
  passed with `whole_specs` (P() for replicated). For Pallas kernels compiled by Mosaic: a
  Mosaic custom call cannot be partitioned by XLA, so it must see per-device arrays."""
  mesh = jax.sharding.get_abstract_mesh()
  ways = math.prod(dict(mesh.shape)[a] for a in token_axes)
  num_tokens = rows[0].shape[0]
  pad = -num_tokens % ways
  pad_rows = lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
  tokens = P(token_axes)
  out = jax.shard_map(
      fn, mesh=mesh, in_specs=(*(tokens,) * len(rows), whole_specs), out_specs=tokens,
      check_vma=False)(*(pad_rows(a) for a in rows), whole)
  return out[:num_tokens]


def token_local_forward(x_TxD, weights_TxK, indices_TxK, experts, token_axes, *,
                        local_dispatch: Callable, quant: str = "none", logical_axes=None):
  """Routed-expert output without expert parallelism, each token shard dispatching its own
  rows to every expert (per_token_shard; the experts gathered whole, as FSDP does anyway).
  logical_axes: as for `moe_forward` (the weights' FSDP dimensions gathered inside, their
  gradient reduce-scattered)."""
  weight_specs = _weight_specs(experts, logical_axes, token_axes,
                               jax.sharding.get_abstract_mesh())

  def shard_body(x, weights, indices, local_experts):
    local_experts = _gather_weights(local_experts, weight_specs)
    return local_dispatch(x, weights, indices, local_experts, quant=quant)

  return per_token_shard(shard_body, token_axes, (x_TxD, weights_TxK, indices_TxK), experts,
                         jax.tree.map(lambda _, spec: spec[0], experts, weight_specs))
