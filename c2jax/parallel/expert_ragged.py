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
     received rows lie by source shard, then by local expert;
  4. runs its E_local experts on them with a plain MoE dispatch function, the rows past
     the received count naming expert E_local, which no dispatch computes;
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
  """`lax.ragged_all_to_all` with one slice per peer, from an all-gather (any platform).

  Peer i's slice `operand_i[input_offsets_i[me] : + send_sizes_i[me]]` lands at
  `output[output_offsets_i[me] : + send_sizes_i[me]]` of this shard `me`; rows no slice
  covers keep `output`'s values. `recv_sizes` must equal what the peers send (as for the
  real collective); it is checked by nothing here, as there."""
  del recv_sizes  # the senders' sizes say the same, and are the ones the rows follow
  me = jax.lax.axis_index(axis_name)
  operands = jax.lax.all_gather(operand, axis_name)            # [N, rows, ...]
  starts_N = jax.lax.all_gather(input_offsets, axis_name)[:, me]
  sizes_N = jax.lax.all_gather(send_sizes, axis_name)[:, me]
  lands_N = jax.lax.all_gather(output_offsets, axis_name)[:, me]
  row_R = jnp.arange(output.shape[0])
  inside_RxN = (row_R[:, None] >= lands_N) & (row_R[:, None] < lands_N + sizes_N)
  source_R = jnp.argmax(inside_RxN, axis=1)
  covered_R = jnp.any(inside_RxN, axis=1)
  src_row_R = jnp.clip(starts_N[source_R] + row_R - lands_N[source_R], 0,
                       operand.shape[0] - 1)
  received = operands[source_R, src_row_R]
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
  rows = jnp.zeros(like_M.shape + cotangent_RxD.shape[1:], cotangent_RxD.dtype)
  return jax.vjp(plain, rows)[1](cotangent_RxD)[0], None


_quantized_exchange.defvjp(_quantized_exchange_fwd, _quantized_exchange_bwd)


def dispatch_combine_ragged(x_TxD, weights_TxK, indices_TxK, valid_T, local_experts, *,
                            axis_names: tuple[str, ...], num_shards: int,
                            local_dispatch: Callable, quant: str = "none",
                            dispatch_format: str | None = None):
  """One shard's side of dropless EP with ragged exchanges (call inside shard_map, as
  `expert.dispatch_combine_local`, whose arguments and result these are; `dropped` is 0)."""
  num_tokens, top_k = indices_TxK.shape
  experts_per_shard = jax.tree.leaves(local_experts)[0].shape[0]
  num_experts = experts_per_shard * num_shards
  num_copies = num_tokens * top_k
  num_rows = num_shards * num_copies
  exchange = ragged_exchange(axis_names)

  # 1. Copies sorted by global expert; unsent (padding) copies last, under expert E.
  expert_M = jnp.where(jnp.repeat(valid_T, top_k), indices_TxK.reshape(-1), num_experts)
  order_M = jnp.argsort(expert_M, stable=True)
  send_MxD = jnp.take(x_TxD, order_M // top_k, axis=0)

  # 2. Every shard's copies per global expert: [source, destination, local expert].
  counts_E = jax.nn.one_hot(expert_M, num_experts + 1, dtype=jnp.int32).sum(0)[:num_experts]
  counts_NxNxL = jax.lax.all_gather(counts_E, axis_names).reshape(
      num_shards, num_shards, experts_per_shard)
  pairs_NxN = counts_NxNxL.sum(-1)                       # rows source i sends to j
  me = jax.lax.axis_index(axis_names)
  exclusive = lambda a, axis: jnp.cumsum(a, axis=axis) - a
  send_starts_NxN = exclusive(pairs_NxN, 1)              # where i's rows for j begin on i
  recv_starts_NxN = exclusive(pairs_NxN, 0)              # where i's rows land on j
  send_sizes, recv_sizes = pairs_NxN[me], pairs_NxN[:, me]
  input_offsets, output_offsets = send_starts_NxN[me], recv_starts_NxN[me]

  # 3. Rows in: by source shard, then by local expert within each source's slice.
  offsets = (input_offsets, send_sizes, output_offsets, recv_sizes)
  recv_zeros = jnp.zeros((num_rows, x_TxD.shape[1]), x_TxD.dtype)
  if dispatch_format is None:
    recv_RxD = exchange(send_MxD, recv_zeros, *offsets)
  else:
    recv_RxD = _quantized_exchange(send_MxD, offsets, num_rows, exchange, dispatch_format)
  segment_ends = jnp.cumsum(counts_NxNxL[:, me, :].reshape(-1))  # (source, local expert)
  segment_R = jnp.sum(jnp.arange(num_rows)[:, None] >= segment_ends[None, :], axis=1)
  local_expert_R = jnp.where(segment_R < segment_ends.shape[0],
                             segment_R % experts_per_shard, experts_per_shard)

  # 4. This shard's experts; each row is one copy with gate weight 1 (the sender applies
  # the real one).
  ones_Rx1 = jnp.ones((num_rows, 1), jnp.float32)
  out_RxD = local_dispatch(recv_RxD, ones_Rx1, local_expert_R[:, None].astype(jnp.int32),
                           local_experts, quant=quant)

  # 5. Back to each sender, into its sorted order; unsent copies stay zero.
  back_MxD = exchange(out_RxD, jnp.zeros((num_copies, x_TxD.shape[1]), out_RxD.dtype),
                      recv_starts_NxN[:, me], recv_sizes, send_starts_NxN[:, me], send_sizes)
  out_MxD = jnp.zeros_like(back_MxD).at[order_M].set(back_MxD)
  y_TxD = jnp.einsum("tkd,tk->td", out_MxD.reshape(num_tokens, top_k, -1).astype(
      jnp.float32), weights_TxK * valid_T[:, None])
  return y_TxD.astype(x_TxD.dtype), jnp.zeros((), jnp.int32)
