"""Log-probabilities of given tokens under the LM head, in chunks: no [B, L, V] array.

    logp_BxL = token_logprobs(hidden_BxLxD, kernel_DxV, targets_BxL, temperature)

computes log softmax(hidden @ kernel / temperature)[target] per position. The plain way
materialises the float32 logits [B, L, V] (and, under autodiff, the softmax of the same
size): at L = 8192 and a 160k vocabulary that is ~5 GB per sequence, more than the rest of
the step. Here the sequence is cut into chunks of `seq_chunk` positions and the vocabulary
into chunks of `vocab_chunk` columns; the forward keeps an online logsumexp per position
(running max and rescaled sum) and the logit of the target, so the largest live array is
[B, seq_chunk, vocab_chunk]. The custom VJP saves only the logsumexp [B, L] and recomputes
each chunk's logits in the backward pass:
    d logp_t / d z_v = (onehot(target)_v - softmax(z)_v) / temperature,
vocabulary chunk by vocabulary chunk: d kernel of a chunk summed over the sequence in a
float32 [D, W] buffer and written once into the kernel-dtype gradient, d hidden summed
over the vocabulary in a float32 [B, L, D] buffer.

The batch axis is never cut, so a batch sharded over data-parallel devices stays sharded.
The matmul runs in hidden's dtype with float32 accumulation, as the model's lm_head.
`token_logprobs_reference` is the plain computation the tests compare against.
Legend: B batch, L length, D hidden size, V vocab, C seq_chunk, W vocab_chunk.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def token_logprobs_reference(hidden_BxLxD, kernel_DxV, targets_BxL, temperature=1.0):
  """The plain computation: full float32 logits, log_softmax, gather."""
  logits_BxLxV = jnp.einsum("bld,dv->blv", hidden_BxLxD, kernel_DxV.astype(hidden_BxLxD.dtype),
                            preferred_element_type=jnp.float32) / temperature
  logp_BxLxV = jax.nn.log_softmax(logits_BxLxV, axis=-1)
  return jnp.take_along_axis(logp_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]


def token_logprobs(hidden_BxLxD, kernel_DxV, targets_BxL, temperature=1.0, *,
                   seq_chunk: int = 512, vocab_chunk: int = 8192) -> jax.Array:
  """float32 [B, L]: log softmax(hidden @ kernel / temperature) at each target token.

  targets must lie in [0, V) (pad positions with any valid id and mask them later).
  temperature: a positive scalar (traced or not); it gets no gradient.
  """
  if hidden_BxLxD.ndim != 3 or kernel_DxV.ndim != 2 or targets_BxL.shape != hidden_BxLxD.shape[:2]:
    raise ValueError(f"token_logprobs wants hidden [B, L, D], kernel [D, V], targets [B, L]; "
                     f"got {hidden_BxLxD.shape}, {kernel_DxV.shape}, {targets_BxL.shape}.")
  if hidden_BxLxD.shape[-1] != kernel_DxV.shape[0]:
    raise ValueError(f"hidden size {hidden_BxLxD.shape[-1]} != kernel rows {kernel_DxV.shape[0]}.")
  if seq_chunk < 1 or vocab_chunk < 1:
    raise ValueError(f"seq_chunk ({seq_chunk}) and vocab_chunk ({vocab_chunk}) must be >= 1.")
  length, vocab = hidden_BxLxD.shape[1], kernel_DxV.shape[1]
  seq_chunk, vocab_chunk = min(seq_chunk, length), min(vocab_chunk, vocab)
  pad_l, pad_v = -length % seq_chunk, -vocab % vocab_chunk
  if pad_l:
    hidden_BxLxD = jnp.pad(hidden_BxLxD, ((0, 0), (0, pad_l), (0, 0)))
    targets_BxL = jnp.pad(targets_BxL, ((0, 0), (0, pad_l)))
  if pad_v:  # zero columns, masked to -inf inside (a copy of the kernel only in this case)
    kernel_DxV = jnp.pad(kernel_DxV, ((0, 0), (0, pad_v)))
  temperature = jnp.asarray(temperature, jnp.float32)
  logp_BxL = _chunked(hidden_BxLxD, kernel_DxV, targets_BxL.astype(jnp.int32), temperature,
                      seq_chunk, vocab_chunk, vocab)
  return logp_BxL[:, :length]


def _logits_chunk(h_BxCxD, kernel_DxV, j, vocab_chunk, vocab, temperature):
  """Scaled float32 logits of vocab chunk j, padded columns at -inf."""
  w_DxW = jax.lax.dynamic_slice_in_dim(kernel_DxV, j * vocab_chunk, vocab_chunk, axis=1)
  z_BxCxW = jnp.einsum("bcd,dw->bcw", h_BxCxD, w_DxW.astype(h_BxCxD.dtype),
                       preferred_element_type=jnp.float32) / temperature
  column_W = j * vocab_chunk + jnp.arange(vocab_chunk)
  return jnp.where(column_W < vocab, z_BxCxW, -jnp.inf), column_W


def _seq_slice(x, i, seq_chunk):
  return jax.lax.dynamic_slice_in_dim(x, i * seq_chunk, seq_chunk, axis=1)


def _forward(hidden_BxLxD, kernel_DxV, targets_BxL, temperature, seq_chunk, vocab_chunk, vocab):
  """(logp [B, L], logsumexp [B, L]) by an online logsumexp over vocab chunks."""
  num_v = kernel_DxV.shape[1] // vocab_chunk

  def seq_step(_, i):
    h_BxCxD = _seq_slice(hidden_BxLxD, i, seq_chunk)
    t_BxC = _seq_slice(targets_BxL, i, seq_chunk)

    def vocab_step(carry, j):
      max_BxC, sum_BxC, picked_BxC = carry
      z_BxCxW, column_W = _logits_chunk(h_BxCxD, kernel_DxV, j, vocab_chunk, vocab, temperature)
      new_max_BxC = jnp.maximum(max_BxC, z_BxCxW.max(-1))
      sum_BxC = (sum_BxC * jnp.exp(max_BxC - new_max_BxC)
                 + jnp.exp(z_BxCxW - new_max_BxC[..., None]).sum(-1))
      hit_BxCxW = column_W == t_BxC[..., None]
      picked_BxC = picked_BxC + jnp.where(hit_BxCxW, z_BxCxW, 0.0).sum(-1)
      return (new_max_BxC, sum_BxC, picked_BxC), None

    shape = t_BxC.shape
    init = (jnp.full(shape, -jnp.inf), jnp.zeros(shape), jnp.zeros(shape))
    (max_BxC, sum_BxC, picked_BxC), _ = jax.lax.scan(vocab_step, init, jnp.arange(num_v))
    lse_BxC = max_BxC + jnp.log(sum_BxC)
    return None, (picked_BxC - lse_BxC, lse_BxC)

  num_l = hidden_BxLxD.shape[1] // seq_chunk
  _, (logp_NxBxC, lse_NxBxC) = jax.lax.scan(seq_step, None, jnp.arange(num_l))
  unchunk = lambda x: jnp.moveaxis(x, 0, 1).reshape(targets_BxL.shape)
  return unchunk(logp_NxBxC), unchunk(lse_NxBxC)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _chunked(hidden_BxLxD, kernel_DxV, targets_BxL, temperature, seq_chunk, vocab_chunk, vocab):
  return _forward(hidden_BxLxD, kernel_DxV, targets_BxL, temperature, seq_chunk, vocab_chunk,
                  vocab)[0]


def _chunked_fwd(hidden_BxLxD, kernel_DxV, targets_BxL, temperature, seq_chunk, vocab_chunk,
                 vocab):
  logp_BxL, lse_BxL = _forward(hidden_BxLxD, kernel_DxV, targets_BxL, temperature, seq_chunk,
                               vocab_chunk, vocab)
  return logp_BxL, (hidden_BxLxD, kernel_DxV, targets_BxL, temperature, lse_BxL)


def _chunked_bwd(seq_chunk, vocab_chunk, vocab, residuals, g_BxL):
  """Vocabulary chunks outside, sequence chunks inside: each chunk's kernel gradient is
  summed over the sequence in a float32 [D, W] buffer and written once into its columns
  of the kernel-dtype [D, V] gradient, and the hidden state's gradient is summed over
  the vocabulary in a float32 [B, L, D] buffer; no float32 [D, V] array exists (at
  Kimi-K2.5's vocabulary, 4.7 GB on one device)."""
  hidden_BxLxD, kernel_DxV, targets_BxL, temperature, lse_BxL = residuals
  num_v = kernel_DxV.shape[1] // vocab_chunk
  num_l = hidden_BxLxD.shape[1] // seq_chunk
  g_BxL = g_BxL.astype(jnp.float32)
  dtype = hidden_BxLxD.dtype

  def vocab_step(j, grads):
    dh_BxLxD, dkernel_DxV = grads
    w_DxW = jax.lax.dynamic_slice_in_dim(kernel_DxV, j * vocab_chunk, vocab_chunk,
                                         axis=1).astype(dtype)

    def seq_step(i, carry):
      dh_BxLxD, dw_DxW = carry
      h_BxCxD = _seq_slice(hidden_BxLxD, i, seq_chunk)
      t_BxC = _seq_slice(targets_BxL, i, seq_chunk)
      z_BxCxW, column_W = _logits_chunk(h_BxCxD, kernel_DxV, j, vocab_chunk, vocab,
                                        temperature)
      softmax_BxCxW = jnp.exp(z_BxCxW - _seq_slice(lse_BxL, i, seq_chunk)[..., None])
      onehot_BxCxW = (column_W == t_BxC[..., None]).astype(jnp.float32)
      dz_BxCxW = ((_seq_slice(g_BxL, i, seq_chunk)[..., None] / temperature)
                  * (onehot_BxCxW - softmax_BxCxW)).astype(dtype)
      dh_BxCxD = _seq_slice(dh_BxLxD, i, seq_chunk) + jnp.einsum(
          "bcw,dw->bcd", dz_BxCxW, w_DxW, preferred_element_type=jnp.float32)
      dh_BxLxD = jax.lax.dynamic_update_slice_in_dim(dh_BxLxD, dh_BxCxD, i * seq_chunk,
                                                     axis=1)
      dw_DxW = dw_DxW + jnp.einsum("bcd,bcw->dw", h_BxCxD, dz_BxCxW,
                                   preferred_element_type=jnp.float32)
      return dh_BxLxD, dw_DxW

    dh_BxLxD, dw_DxW = jax.lax.fori_loop(
        0, num_l, seq_step, (dh_BxLxD, jnp.zeros((kernel_DxV.shape[0], vocab_chunk),
                                                 jnp.float32)))
    dkernel_DxV = jax.lax.dynamic_update_slice_in_dim(
        dkernel_DxV, dw_DxW.astype(dkernel_DxV.dtype), j * vocab_chunk, axis=1)
    return dh_BxLxD, dkernel_DxV

  dh_BxLxD, dkernel_DxV = jax.lax.fori_loop(
      0, num_v, vocab_step, (jnp.zeros(hidden_BxLxD.shape, jnp.float32),
                             jnp.zeros_like(kernel_DxV)))
  return dh_BxLxD.astype(dtype), dkernel_DxV, None, jnp.zeros_like(temperature)


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


# The logit of a padded vocabulary column (here and in mtp's chunked loss): exp() of it
# is 0, and differences between two of them are 0 (not NaN, as with -inf).
MASKED_LOGIT = -1e30


def vocab_chunked_nll(hidden_BxLxD, kernel_DxV, labels_BxL, vocab_chunk: int) -> jax.Array:
  """float32 [B, L]: -log softmax(hidden @ kernel)[label], over vocabulary chunks of
  `vocab_chunk` columns: the training loss's cross entropy without [B, L, V] logits.

  Unlike token_logprobs it never cuts the sequence, so hidden split over the batch and
  sequence axes (data, fsdp, context parallel) stays split. The forward is a scan over
  chunks carrying a running max, rescaled sum and the label's logit per position (a
  masked sum, not a gather: the TPU compiler offloads a gather's transpose to the
  SparseCore, outside its cost model); the custom VJP keeps only the logsumexp [B, L] and
  recomputes each chunk's logits in a loop:
      d nll / d z = g * (softmax(z) - onehot(label)),
  summing the hidden state's gradient in float32 (rounded once) and writing each chunk's
  kernel gradient into its columns of one [D, V] array in the kernel's compute dtype, as
  the full-logits loss rounds it. Each chunk is a dynamic slice of the kernel's columns
  (the last one shifted left to end at V, its columns already seen masked out), so no
  padded, reshaped or transposed copy of the kernel or of its gradient exists: at
  Kimi-K2.5's vocabulary on one v5p chip, 8,192 tokens, the step's temporaries went from
  9.63 GB (a scan whose stacked float32 chunk gradients were transposed back) to 0.71 GB
  (docs/kernels.md). Under FSDP each chunk gathers one [D, W] slice and its gradient
  stays in the kernel's own layout.
  Matmuls run in hidden's dtype with float32 accumulation, as the model's lm_head.
  """
  if vocab_chunk < 1:
    raise ValueError(f"vocab_chunk must be >= 1; got {vocab_chunk}.")
  if hidden_BxLxD.ndim != 3 or kernel_DxV.ndim != 2 or labels_BxL.shape != hidden_BxLxD.shape[:2]:
    raise ValueError(f"vocab_chunked_nll wants hidden [B, L, D], kernel [D, V], labels [B, L];"
                     f" got {hidden_BxLxD.shape}, {kernel_DxV.shape}, {labels_BxL.shape}.")
  chunk = min(vocab_chunk, kernel_DxV.shape[1])
  return _vocab_chunked(hidden_BxLxD, kernel_DxV.astype(hidden_BxLxD.dtype),
                        labels_BxL.astype(jnp.int32), chunk)


def _vocab_columns(kernel_DxV, j, chunk):
  """Chunk j: (its columns [D, W], its first column, the column ids [W], which of them
  are new to chunk j). The last chunk starts at V - W, so its first columns repeat the
  previous chunk's; they are masked out."""
  start = jnp.minimum(j * chunk, kernel_DxV.shape[1] - chunk)
  column_W = start + jnp.arange(chunk)
  w_DxW = jax.lax.dynamic_slice_in_dim(kernel_DxV, start, chunk, axis=1)
  return w_DxW, start, column_W, column_W >= j * chunk


def _vocab_chunked_forward(hidden_BxLxD, kernel_DxV, labels_BxL, chunk):
  """(nll [B, L], logsumexp [B, L]), both float32."""
  def step(carry, j):
    run_max, run_sum, label_logit = carry
    w_DxW, _, column_W, new_W = _vocab_columns(kernel_DxV, j, chunk)
    z_BxLxW = jnp.einsum("bld,dw->blw", hidden_BxLxD, w_DxW,
                         preferred_element_type=jnp.float32)
    z_BxLxW = jnp.where(new_W, z_BxLxW, MASKED_LOGIT)
    new_max = jnp.maximum(run_max, jnp.max(z_BxLxW, axis=-1))
    run_sum = (run_sum * jnp.exp(run_max - new_max)
               + jnp.sum(jnp.exp(z_BxLxW - new_max[..., None]), axis=-1))
    label_logit = label_logit + jnp.sum(
        jnp.where((column_W == labels_BxL[..., None]) & new_W, z_BxLxW, 0.0), axis=-1)
    return (new_max, run_sum, label_logit), None

  shape = labels_BxL.shape
  init = (jnp.full(shape, MASKED_LOGIT, jnp.float32), jnp.zeros(shape, jnp.float32),
          jnp.zeros(shape, jnp.float32))
  num = -(-kernel_DxV.shape[1] // chunk)
  (run_max, run_sum, label_logit), _ = jax.lax.scan(step, init, jnp.arange(num))
  lse_BxL = run_max + jnp.log(run_sum)
  return lse_BxL - label_logit, lse_BxL


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _vocab_chunked(hidden_BxLxD, kernel_DxV, labels_BxL, chunk):
  return _vocab_chunked_forward(hidden_BxLxD, kernel_DxV, labels_BxL, chunk)[0]


def _vocab_chunked_fwd(hidden_BxLxD, kernel_DxV, labels_BxL, chunk):
  nll_BxL, lse_BxL = _vocab_chunked_forward(hidden_BxLxD, kernel_DxV, labels_BxL, chunk)
  return nll_BxL, (hidden_BxLxD, kernel_DxV, labels_BxL, lse_BxL)


def _vocab_chunked_bwd(chunk, residuals, g_BxL):
  hidden_BxLxD, kernel_DxV, labels_BxL, lse_BxL = residuals

  def body(j, grads):
    dh_BxLxD, dk_DxV = grads
    w_DxW, start, column_W, new_W = _vocab_columns(kernel_DxV, j, chunk)
    z_BxLxW = jnp.einsum("bld,dw->blw", hidden_BxLxD, w_DxW,
                         preferred_element_type=jnp.float32)
    p_BxLxW = jnp.exp(z_BxLxW - lse_BxL[..., None])
    dz_BxLxW = jnp.where(new_W, g_BxL[..., None] * (
        p_BxLxW - (column_W == labels_BxL[..., None])), 0.0)
    dh_BxLxD = dh_BxLxD + jnp.einsum("blw,dw->bld", dz_BxLxW, w_DxW,
                                     preferred_element_type=jnp.float32)
    dw_DxW = jnp.einsum("bld,blw->dw", hidden_BxLxD, dz_BxLxW,
                        preferred_element_type=jnp.float32)
    seen_DxW = jax.lax.dynamic_slice_in_dim(dk_DxV, start, chunk, axis=1)
    dk_DxV = jax.lax.dynamic_update_slice_in_dim(
        dk_DxV, seen_DxW + dw_DxW.astype(dk_DxV.dtype), start, axis=1)
    return dh_BxLxD, dk_DxV

  num = -(-kernel_DxV.shape[1] // chunk)
  dh_BxLxD, dk_DxV = jax.lax.fori_loop(
      0, num, body, (jnp.zeros(hidden_BxLxD.shape, jnp.float32), jnp.zeros_like(kernel_DxV)))
  return dh_BxLxD.astype(hidden_BxLxD.dtype), dk_DxV, None


_vocab_chunked.defvjp(_vocab_chunked_fwd, _vocab_chunked_bwd)


def library_nll(hidden_BxLxD, kernel_DxV, labels_BxL) -> jax.Array:
  """float32 [B, L]: -log softmax(hidden @ kernel)[label] through tokamax's fused linear
  cross entropy (c2jax_kernels.lm_head_loss: its Pallas kernel on a TPU; config
  train.loss_impl='tokamax'). A Mosaic kernel is a custom call XLA cannot partition, so
  where the tokens are split over devices (the 'batch' and 'length' rules) each shard runs
  it on its own rows inside shard_map, the kernel gathered whole (as FSDP gathers it for
  the matmul anyway) and its gradient summed over the shards."""
  import c2jax_kernels as kernels  # pylint: disable=g-import-not-at-top
  from c2jax.parallel import expert as expert_parallel  # pylint: disable=g-import-not-at-top
  b, l, d = hidden_BxLxD.shape
  x_TxD, labels_T = hidden_BxLxD.reshape(b * l, d), labels_BxL.reshape(b * l)
  token_axes = expert_parallel.token_axes_from_context()
  if not token_axes or kernels.target_platform() == "cpu":  # plain XLA partitions itself
    return kernels.lm_head_loss.linear_cross_entropy(x_TxD, kernel_DxV, labels_T).reshape(b, l)
  nll_T = expert_parallel.per_token_shard(
      lambda x, y, kernel: kernels.lm_head_loss.linear_cross_entropy(x, kernel, y),
      token_axes, (x_TxD, labels_T), kernel_DxV, jax.sharding.PartitionSpec())
  return nll_T.reshape(b, l)
