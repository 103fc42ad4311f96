"""The pure training step: `train_step(state, batch) -> (state, metrics)`.

Shapes: B batch, L length, V vocab. A batch is a dict of [B, L] arrays:
  inputs (int32), targets (int32), positions (int32), segment_ids (int32; 0 = padding),
  loss_mask (float32; 1 where the target token is trained on).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from c2jax import model
from c2jax.model import moe

Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def create_train_state(cfg, optimizer, rng) -> TrainState:
  params = model.init(cfg, rng)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params))


def loss_fn(cfg, params, batch: Batch):
  """Mean next-token cross entropy over loss_mask tokens, plus the MoE auxiliary loss."""
  logits_BxLxV, aux, _ = model.apply(
      cfg, params, batch["inputs"], positions_BxL=batch["positions"],
      segment_ids_BxL=batch["segment_ids"])
  nll_BxL = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, batch["targets"])
  mask_BxL = batch["loss_mask"].astype(jnp.float32)
  tokens = jnp.maximum(mask_BxL.sum(), 1.0)
  ce = (nll_BxL * mask_BxL).sum() / tokens
  loss = ce + aux["aux_loss"]
  return loss, {"ce_loss": ce, "aux_loss": aux["aux_loss"], "tokens": mask_BxL.sum(),
                "expert_loads": aux["expert_loads"]}


def train_step(cfg, optimizer, state: TrainState, batch: Batch):
  """One optimizer step, then the aux-loss-free correction-bias update (outside Adam)."""
  grad_fn = jax.value_and_grad(lambda p: loss_fn(cfg, p, batch), has_aux=True)
  (loss, stats), grads = grad_fn(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  if cfg.num_layers > cfg.first_k_dense and cfg.moe.router == "sigmoid_bias":
    params = moe.update_correction_bias(params, stats["expert_loads"],
                                        cfg.moe.bias_update_rate)
  metrics = {"loss": loss, "ce_loss": stats["ce_loss"], "aux_loss": stats["aux_loss"],
             "tokens": stats["tokens"], "grad_norm": optax.tree_utils.tree_l2_norm(grads)}
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics
