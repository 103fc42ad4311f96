"""Dropless expert parallelism with ragged exchanges: each shard sends only the token
copies it has for another, not a worst-case bucket per destination.

`c2jax.parallel.expert`'s fixed exchange sends an [N, C, D] buffer both ways; without
drops C = T_local * K, so N times more rows travel (and are gathered, exchanged and
scattered) than there are copies. Here, inside `jax.shard_map`, every shard:
  1. sorts its M = T_local * K copies by global expert (so by destination shard, and by
     local expert within a destination) into an [M, D] send buffer;
  2. all-gathers the per-expert copy counts of every shard ([N, E] int32, tiny), from
     which each shard derives all offsets and sizes without another collective;
  3. exchanges rows with `lax.ragged_all_to_all` into an [N * M, D] receive buffer (a shard
     may receive every copy of every shard: the buffer is worst-case, the traffic is not);
  4. runs its E_local experts on them: one ragged slice per (destination, local expert)
     puts every source's rows for expert e in expert e's block of the receive buffer, so
     the grouped matmuls run on it as it lies, with no second sort;
  5. returns the outputs with the reverse ragged exchange into the sender's sorted order,
     unsorts, and combines with the float32 gate weights.
Nothing is dropped. The receive buffer is what MaxText's dropless path allocates too.

XLA:CPU has no ragged-all-to-all ("HLO opcode ragged-all-to-all is not supported by
XLA:CPU ThunkEmitter", jax 0.12), so on the CPU the same exchange runs as
`emulated_ragged_all_to_all`: an all-gather of every shard's operand and offsets, then
each shard picks the rows addressed to it, with the semantics of `lax.ragged_all_to_all`
(its docstring's example is a test). That keeps every offset computation here testable on
fake CPU devices; the accelerators run the real collective, whose transpose JAX defines.

Shapes: T tokens on this shard, K experts per token, D hidden, E experts, N EP shards,
E_local = E / N, M = T * K copies, R = N * M receive rows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

import c2jax_kernels as kernels


def emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets,
                               recv_sizes, *, axis_name):
  """`lax.ragged_all_to_all` from an all-gather (any platform), S slices per peer.

  Slice k of peer i (k in [me * S, (me + 1) * S) for this shard `me`, S = len(offsets) / N)
  is `operand_i[input_offsets_i[k] : + send_sizes_i[k]]` and lands at
  `output[output_offsets_i[k] : + send_sizes_i[k]]`; rows no slice covers keep `output`'s
  values. `recv_sizes` must equal what the peers send (as for the real collective); the
  rows follow the senders' sizes."""
  del recv_sizes
  me = jax.lax.axis_index(axis_name)
  operands = jax.lax.all_gather(operand, axis_name)            # [N, rows, ...]
  num_peers = operands.shape[0]
  per_peer = input_offsets.shape[0] // num_peers

  def mine(a):  # [N, N * S] -> the N * S slices addressed to this shard, by source
    return jax.lax.dynamic_slice_in_dim(
        jax.lax.all_gather(a, axis_name), me * per_peer, per_peer, axis=1).reshape(-1)
  starts, sizes, lands = mine(input_offsets), mine(send_sizes), mine(output_offsets)
  source = jnp.arange(num_peers * per_peer) // per_peer
  row_R = jnp.arange(output.shape[0])
  inside_RxQ = (row_R[:, None] >= lands) & (row_R[:, None] < lands + sizes)
  slice_R = jnp.argmax(inside_RxQ, axis=1)
  covered_R = jnp.any(inside_RxQ, axis=1)
  src_row_R = jnp.clip(starts[slice_R] + row_R - lands[slice_R], 0, operand.shape[0] - 1)
  received = operands[source[slice_R], src_row_R]
  covered = covered_R.reshape((-1,) + (1,) * (output.ndim - 1))
  return jnp.where(covered, received, output)


def ragged_exchange(axis_names):
  """The ragged all-to-all for the platform the step compiles for: XLA's collective on
  TPU and GPU, the all-gather emulation on the CPU."""
  if kernels.target_platform() == "cpu":
    return functools.partial(emulated_ragged_all_to_all, axis_name=axis_names)
  return functools.partial(jax.lax.ragged_all_to_all, axis_name=axis_names)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _quantized_exchange(rows_MxD, offsets, num_rows, exchange, fmt):
  """`exchange` of block-quantised rows into `num_rows` zero rows, dequantised on arrival
  to rows_MxD.dtype. Rows no peer writes keep zero values and zero-bit scales, so they
  dequantise to zeros, as in the unquantised exchange. The gradient is straight-through:
  the cotangent travels back unquantised."""
  q = kernels.quantize(rows_MxD, fmt, axis=-1)
  into = lambda a: jnp.zeros((num_rows,) + a.shape[1:], a.dtype)
  values = exchange(q.values, into(q.values), *offsets)
  scales = exchange(q.scales, into(q.scales), *offsets)
  return kernels.dequantize(dataclasses.replace(q, values=values, scales=scales),
                            dtype=rows_MxD.dtype)


def _quantized_exchange_fwd(rows_MxD, offsets, num_rows, exchange, fmt):
  return _quantized_exchange(rows_MxD, offsets, num_rows, exchange, fmt), (
      offsets, jnp.zeros(rows_MxD.shape[:1], rows_MxD.dtype))


def _quantized_exchange_bwd(num_rows, exchange, fmt, residuals, cotangent_RxD):
  del fmt
  offsets, like_M = residuals
  plain = lambda rows: exchange(rows, jnp.zeros((num_rows,) + rows.shape[1:], rows.dtype),
                                *offsets)
  rows = jax.ShapeDtypeStruct(like_M.shape + cotangent_RxD.shape[1:], cotangent_RxD.dtype)
  # The exchange is linear in its rows: transpose it, without running it forward again.
  return jax.linear_transpose(plain, rows)(cotangent_RxD)[0], None


_quantized_exchange.defvjp(_quantized_exchange_fwd, _quantized_exchange_bwd)


def dispatch_combine_ragged(x_TxD, weights_TxK, indices_TxK, valid_T, local_experts, *,
                            axis_names: tuple[str, ...], num_shards: int,
                            local_grouped: Callable, quant: str = "none",
                            dispatch_format: str | None = None):
  """One shard's side of dropless EP with ragged exchanges (call inside shard_map).

  Arguments and result as `expert.dispatch_combine_local` (`dropped` is 0), except
  local_grouped: (rows, group_sizes_L, local_experts, quant=) -> outputs, the experts'
  grouped matmuls on rows already grouped by local expert (moe_dispatch.grouped_experts):
  each source's rows for expert e land in expert e's block of the receive buffer (one
  ragged slice per destination and expert), so the receiver does not sort them again.
  """
  num_tokens, top_k = indices_TxK.shape
  experts_per_shard = jax.tree.leaves(local_experts)[0].shape[0]
  num_experts = experts_per_shard * num_shards
  num_copies = num_tokens * top_k
  num_rows = num_shards * num_copies
  exchange = ragged_exchange(axis_names)

  # 1. Copies sorted by global expert (destination shard, then its local expert); unsent
  # (padding) copies last, under expert E.
  expert_M = jnp.where(jnp.repeat(valid_T, top_k), indices_TxK.reshape(-1), num_experts)
  order_M = jnp.argsort(expert_M, stable=True)
  send_MxD = jnp.take(x_TxD, order_M // top_k, axis=0)

  # 2. Every shard's copies per expert, C[source i, destination j, local expert e], and
  # where each (i, j, e) block starts on its sender (sorted by expert) and on its receiver
  # (by local expert, then by source).
  counts_E = jax.nn.one_hot(expert_M, num_experts + 1, dtype=jnp.int32).sum(0)[:num_experts]
  counts_NxNxL = jax.lax.all_gather(counts_E, axis_names).reshape(
      num_shards, num_shards, experts_per_shard)
  exclusive = lambda a, axis: jnp.cumsum(a, axis=axis) - a
  send_pos_NxNxL = exclusive(counts_NxNxL.reshape(num_shards, -1), 1).reshape(
      counts_NxNxL.shape)
  totals_NxL = counts_NxNxL.sum(0)                        # rows each shard's experts get
  recv_pos_NxNxL = exclusive(totals_NxL, 1)[None] + exclusive(counts_NxNxL, 0)
  me = jax.lax.axis_index(axis_names)
  flat = lambda a: a.reshape(-1)
  mine_sent = lambda a: flat(a[me])          # [j, e]: blocks this shard sends
  mine_recv = lambda a: flat(a[:, me])       # [i, e]: blocks this shard receives

  # 3. Rows in, grouped by local expert: one slice per (destination, local expert).
  offsets = (mine_sent(send_pos_NxNxL), mine_sent(counts_NxNxL), mine_sent(recv_pos_NxNxL),
             mine_recv(counts_NxNxL))
  if dispatch_format is None:
    recv_RxD = exchange(send_MxD, jnp.zeros((num_rows, x_TxD.shape[1]), x_TxD.dtype),
                        *offsets)
  else:
    recv_RxD = _quantized_exchange(send_MxD, offsets, num_rows, exchange, dispatch_format)

  # 4. This shard's experts on their blocks (rows past the received ones come out zero).
  out_RxD = local_grouped(recv_RxD, totals_NxL[me], local_experts, quant=quant)

  # 5. Back to each sender, into its sorted order; unsent copies stay zero.
  back_MxD = exchange(out_RxD, jnp.zeros((num_copies, x_TxD.shape[1]), out_RxD.dtype),
                      mine_recv(recv_pos_NxNxL), mine_recv(counts_NxNxL),
                      mine_recv(send_pos_NxNxL), mine_sent(counts_NxNxL))
  out_MxD = jnp.zeros_like(back_MxD).at[order_M].set(back_MxD)
  y_TxD = jnp.einsum("tkd,tk->td", out_MxD.reshape(num_tokens, top_k, -1).astype(
      jnp.float32), weights_TxK * valid_T[:, None])
  return y_TxD.astype(x_TxD.dtype), jnp.zeros((), jnp.int32)
