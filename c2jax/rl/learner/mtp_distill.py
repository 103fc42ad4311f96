"""Online self-distillation of the policy's MTP heads from the learner's own batches.

Actors draft with the policy's MTP modules (config.actors.num_draft_tokens); as RL moves
the policy, heads trained once before RL would drift away from it and acceptance would
decay. Each learner step therefore also trains the heads on the step's batch: MTP depth k
at position i (which drafts token t_{i+k+2}) matches the main head's full distribution at
position i+k+1 (which predicts that same token), KL(main || mtp) to the main model's
stop-gradient softmax (the loss of c2jax.model.mtp.loss with frozen_trunk, as the
pretraining MTP phase computes it from full logits).

Detached from the trunk: the main model's final hidden state, the shared embedding and the
LM head enter the MTP loss under stop_gradient, so the policy gradient of every main
parameter is exactly what it is without this loss (the optimizer also clips the MTP
group's gradient on its own: c2jax.rl.learner.runtime.make_optimizer).

Positions: only tokens the policy generated (loss_mask) are drafted by actors, so only
depths predicting a generated token are trained; prompt and tool-output positions are not.
The KL is taken at temperature 1: equal logits agree at every sampling temperature.

Chunked over the sequence (config.rl.mtp_seq_chunk = C): the MTP blocks run over the whole
sequence (their attention needs it) and give hidden states [Dm, B, L, D]; the LM head, the
two softmaxes and the KL then run on one (depth, chunk of C positions) at a time in a
lax.scan whose body is rematerialised, so the largest float32 arrays are [B, C, V] in the
forward and in the backward pass; no [B, L, V] array exists (teacher logits are recomputed
from the main hidden state shifted by the depth's offset).

Shape legend: Dm MTP depths, N chunks, M = Dm x N scan steps, B rows, L tokens, C chunk, D hidden, V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from c2jax.model import mtp as mtp_lib
from c2jax.model.layers import compute_dtype


def _depth_weights(model_cfg, batch) -> jax.Array:
  """[Dm, B, L]: depth k at i is weighted by the mask of the main head's target at i + k + 1
  (t_{i+k+2}); the batch's loss_mask marks a token at its own position."""
  valid_BxL = batch["valid"].astype(jnp.int32)
  generated_BxL = batch["loss_mask"] * valid_BxL
  target_mask_BxL = mtp_lib.shift_left(generated_BxL, 1)
  return jnp.stack([mtp_lib.depth_weights(valid_BxL, target_mask_BxL, k + 1)
                    for k in range(model_cfg.num_mtp_layers)])


def depth_counts(model_cfg, batch) -> jax.Array:
  """[Dm] trained positions per depth of a whole batch (its microbatches divide by them)."""
  return _depth_weights(model_cfg, batch).sum((1, 2))


def loss(model_cfg, params, hidden_BxLxD, batch, *, seq_chunk: int,
         counts_Dm=None) -> tuple[jax.Array, dict, jax.Array]:
  """(MTP loss, metrics, MTP blocks' MoE balance loss) of one RL batch.

  hidden_BxLxD: the main model's final-normed hidden state of `batch` (the learner's
  forward with head=False). Gradients reach params['mtp_layers'] only. The loss is the
  mean over depths of each depth's KL averaged over its trained positions. Metrics per
  depth k: mtp{k}/kl and mtp{k}/agree (the MTP argmax equals the main argmax: the greedy
  acceptance rate) over the trained positions. seq_chunk: positions per chunk (>= 1).
  counts_Dm: depth_counts of the whole batch when `batch` is a microbatch of it.
  """
  if seq_chunk < 1:
    raise ValueError(f"mtp_distill.loss: seq_chunk is {seq_chunk}; it must be >= 1 "
                     "(config.rl.mtp_seq_chunk).")
  depths = model_cfg.num_mtp_layers
  hidden_BxLxD = jax.lax.stop_gradient(hidden_BxLxD).astype(compute_dtype(model_cfg))
  params = {**params, "embed": jax.lax.stop_gradient(params["embed"]),
            "lm_head": jax.lax.stop_gradient(params["lm_head"])}
  valid_BxL = batch["valid"].astype(jnp.int32)
  student_DmxBxLxD, moe_aux = mtp_lib.hidden_states(model_cfg, params, hidden_BxLxD,
                                                    batch["tokens"], segment_ids_BxL=valid_BxL)
  # The teacher of depth k at i is the main head at i + k + 1.
  teacher_DmxBxLxD = jnp.stack([mtp_lib.shift_left(hidden_BxLxD, k + 1) for k in range(depths)])
  weight_DmxBxL = _depth_weights(model_cfg, batch)
  kl_sum_Dm, agree_sum_Dm = _chunked_sums(params["lm_head"]["kernel"], student_DmxBxLxD,
                                          teacher_DmxBxLxD, weight_DmxBxL, seq_chunk)
  count_Dm = jnp.maximum(weight_DmxBxL.sum((1, 2)) if counts_Dm is None else counts_Dm, 1.0)
  kl_Dm, agree_Dm = kl_sum_Dm / count_Dm, agree_sum_Dm / count_Dm
  metrics = {}
  for k in range(depths):
    metrics[f"mtp{k}/kl"] = kl_Dm[k]
    metrics[f"mtp{k}/agree"] = agree_Dm[k]
  return kl_Dm.mean(), metrics, moe_aux["aux_loss"]


def _chunked_sums(kernel_DxV, student_DmxBxLxD, teacher_DmxBxLxD, weight_DmxBxL, seq_chunk):
  """Per depth: (sum of weight x KL(teacher || student), sum of weight x argmax agreement),
  one (depth, sequence chunk) per scan step."""
  depths, batch, length, dim = student_DmxBxLxD.shape
  chunk = min(seq_chunk, length)
  pad = -length % chunk
  num = (length + pad) // chunk
  kernel_DxV = kernel_DxV.astype(student_DmxBxLxD.dtype)

  def to_chunks(x):  # [Dm, B, L, ...] -> [Dm * N, B, C, ...]
    x = jnp.pad(x, [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 3))
    x = x.reshape((depths, batch, num, chunk) + x.shape[3:])
    return jnp.moveaxis(x, 2, 1).reshape((depths * num, batch, chunk) + x.shape[4:])

  @jax.checkpoint  # the backward recomputes a chunk's logits instead of saving them all
  def chunk_sums(student_BxCxD, teacher_BxCxD, weight_BxC):
    logits = lambda h_BxCxD: jnp.einsum("bcd,dv->bcv", h_BxCxD, kernel_DxV,
                                        preferred_element_type=jnp.float32)
    student_BxCxV = jax.nn.log_softmax(logits(student_BxCxD), axis=-1)
    teacher_BxCxV = jax.nn.log_softmax(logits(teacher_BxCxD), axis=-1)
    kl_BxC = jnp.sum(jnp.exp(teacher_BxCxV) * (teacher_BxCxV - student_BxCxV), axis=-1)
    agree_BxC = jnp.argmax(student_BxCxV, -1) == jnp.argmax(teacher_BxCxV, -1)
    return jnp.sum(kl_BxC * weight_BxC), jnp.sum(agree_BxC * weight_BxC)

  step = lambda _, xs: (None, chunk_sums(*xs))
  _, (kl_M, agree_M) = jax.lax.scan(step, None, (to_chunks(student_DmxBxLxD),
                                                 to_chunks(teacher_DmxBxLxD),
                                                 to_chunks(weight_DmxBxL)))
  return kl_M.reshape(depths, num).sum(1), agree_M.reshape(depths, num).sum(1)
