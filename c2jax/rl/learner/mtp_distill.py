"""Online self-distillation of the policy's MTP heads from the learner's own batches.

Actors draft with the policy's MTP modules (config.actors.num_draft_tokens); as RL moves
the policy, heads trained once before RL would drift away from it and acceptance would
decay. Each learner step therefore also trains the heads on the step's batch: MTP depth k
at position i (which drafts token t_{i+k+2}) matches the main head's full distribution at
position i+k+1 (which predicts that same token), KL(main || mtp) to the main model's
stop-gradient softmax (c2jax.model.mtp.loss, as the pretraining MTP phase does).

Detached from the trunk: the main model's final hidden state, the shared embedding and the
LM head enter the MTP loss under stop_gradient, so the policy gradient of every main
parameter is exactly what it is without this loss (the optimizer also clips the MTP
group's gradient on its own: c2jax.rl.learner.runtime.make_optimizer).

Positions: only tokens the policy generated (loss_mask) are drafted by actors, so only
depths predicting a generated token are trained; prompt and tool-output positions are not.
The KL is taken at temperature 1: equal logits agree at every sampling temperature.

The main and MTP logits are materialised as [B, L, V] / [Dm, B, L, V] float32 (unlike
the chunked policy log-probs): fine at the sizes the CPU runs use; a chunked version is
future work for large vocabularies.

Shape legend: B rows, L tokens, D hidden, V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from c2jax.model import mtp as mtp_lib
from c2jax.model.layers import compute_dtype


def _main_logits(model_cfg, params, hidden_BxLxD):
  kernel_DxV = params["lm_head"]["kernel"].astype(compute_dtype(model_cfg))
  return jnp.einsum("bld,dv->blv", hidden_BxLxD.astype(kernel_DxV.dtype), kernel_DxV,
                    preferred_element_type=jnp.float32)


def loss(model_cfg, params, hidden_BxLxD, batch) -> tuple[jax.Array, dict, jax.Array]:
  """(MTP loss, metrics, MTP blocks' MoE balance loss) of one RL batch.

  hidden_BxLxD: the main model's final-normed hidden state of `batch` (the learner's
  forward with head=False). Gradients reach params['mtp_layers'] only. Metrics per depth k:
  mtp{k}/kl and mtp{k}/agree (the MTP argmax equals the main argmax: the greedy
  acceptance rate) over the trained positions.
  """
  hidden_BxLxD = jax.lax.stop_gradient(hidden_BxLxD)
  main_logits_BxLxV = jax.lax.stop_gradient(_main_logits(model_cfg, params, hidden_BxLxD))
  valid_BxL = batch["valid"].astype(jnp.int32)
  generated_BxL = batch["loss_mask"] * valid_BxL
  # mtp.loss weights depth k at i by mask[i + k + 1], the mask of the main head's target
  # there (t_{i+k+2}); the batch's loss_mask marks a token at its own position.
  target_mask_BxL = jnp.pad(generated_BxL[:, 1:], ((0, 0), (0, 1)))
  total, metrics, moe_aux = mtp_lib.loss(
      model_cfg, params, batch["tokens"], hidden_BxLxD, main_logits_BxLxV,
      segment_ids_BxL=valid_BxL, loss_mask_BxL=target_mask_BxL, frozen_trunk=True)
  return total, metrics, moe_aux["aux_loss"]
