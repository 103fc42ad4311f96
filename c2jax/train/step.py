"""The pure training step: `train_step(state, batch) -> (state, metrics)`.

Shapes: B batch, L length, V vocab. A batch is a dict of [B, L] arrays:
  inputs (int32), targets (int32), positions (int32), segment_ids (int32; 0 = padding),
  loss_mask (float32; 1 where the target token is trained on).

With cfg.num_mtp_layers > 0 the loss adds the MTP self-distillation loss
(c2jax.model.mtp.loss) weighted by `MTPWeights` (config.train.mtp_*). MoE MTP blocks are
balanced like the trunk's MoE layers: their balance loss joins `aux_loss` and their
expert loads nudge their own correction biases.

With `microbatches` = N > 1 the step accumulates the gradients of N microbatches
(c2jax.train.accumulate) before its one optimizer update; every loss term divides by the
whole batch's count (`batch_totals`), so the loss, its gradient, the summed expert loads
that drive the bias update and the metrics are those of the batch taken at once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from c2jax import model
from c2jax.model import moe, mtp as mtp_lib, token_logprobs
from c2jax.train import accumulate

Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class MTPWeights:
  """How the MTP modules train (used only when cfg.num_mtp_layers > 0).

  kl_weight / ce_weight: the weights of the KL to the main head and of the data CE.
  frozen_trunk: the MTP modules train alone on a frozen main model (as when attached to
  a finished checkpoint): nothing outside params['mtp_layers'] changes, and the MTP loss
  sends no gradient into the trunk, embedding or head. Otherwise all train jointly.
  vocab_chunk: vocabulary columns per chunk of the MTP loss (mtp.loss: no [B, L, V]
  array); 0 computes it from the main logits at full size.
  """
  kl_weight: float = 1.0
  ce_weight: float = 0.0
  frozen_trunk: bool = False
  vocab_chunk: int = 8192

  @classmethod
  def from_train_config(cls, train_cfg) -> MTPWeights:
    return cls(kl_weight=float(train_cfg.mtp_kl_weight),
               ce_weight=float(train_cfg.mtp_ce_weight),
               frozen_trunk=bool(train_cfg.mtp_frozen_trunk),
               vocab_chunk=int(train_cfg.mtp_vocab_chunk))


def create_train_state(cfg, optimizer, rng) -> TrainState:
  params = model.init(cfg, rng)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params))


def batch_totals(cfg, batch: Batch) -> dict:
  """The counts loss_fn's terms average over, taken over a whole batch: trained tokens
  (cross entropy), rows with a valid token (the sequence-wise MoE balance loss) and, with
  MTP, valid positions per depth. Microbatches divide by these to sum to the batch's loss."""
  segments_BxL = batch["segment_ids"]
  mask_BxL = batch["loss_mask"].astype(jnp.float32)
  totals = {"tokens": mask_BxL.sum(), "rows": _valid_rows(segments_BxL)}
  if cfg.num_mtp_layers:
    totals["mtp_positions"] = jnp.stack([
        mtp_lib.depth_weights(segments_BxL, mask_BxL, k + 1).sum()
        for k in range(cfg.num_mtp_layers)])
  return totals


def _valid_rows(segment_ids_BxL) -> jax.Array:
  # A max over the row, not any(): under context parallelism the row is split over the
  # `context` axis, and the TPU compiler's cost model has no estimate for an all-reduce
  # of booleans (it then reports a negative step time).
  return (segment_ids_BxL != 0).astype(jnp.float32).max(-1).sum()


def loss_fn(cfg, params, batch: Batch, mtp: MTPWeights | None = None,
            totals: dict | None = None, vocab_chunk: int = 0, loss_impl: str = "c2jax"):
  """Mean next-token cross entropy over loss_mask tokens, plus the MoE auxiliary loss,
  plus (cfg.num_mtp_layers > 0) the weighted MTP loss, reported as `mtp_loss`.

  totals: batch_totals of the whole batch when `batch` is one microbatch of it (the terms
  are then this microbatch's share of the whole batch's); None: `batch` is the batch.
  vocab_chunk: > 0 computes the cross entropy over chunks of that many vocabulary columns
  (token_logprobs.vocab_chunked_nll; config train.loss_vocab_chunk), so no float32
  [B, L, V] logits exist; 0 takes it from the full logits (the reference).
  loss_impl: 'tokamax' computes the cross entropy with tokamax's fused linear cross
  entropy instead (token_logprobs.library_nll; config train.loss_impl); vocab_chunk
  then plays no part.
  """
  totals = batch_totals(cfg, batch) if totals is None else totals
  kwargs = dict(positions_BxL=batch["positions"], segment_ids_BxL=batch["segment_ids"])
  mtp = mtp or MTPWeights()
  hidden_BxLxD = logits_BxLxV = None
  if vocab_chunk or loss_impl == "tokamax":
    hidden_BxLxD, aux, _ = model.apply(cfg, params, batch["inputs"], head=False, **kwargs)
    if loss_impl == "tokamax":
      nll_BxL = token_logprobs.library_nll(hidden_BxLxD, params["lm_head"]["kernel"],
                                           batch["targets"])
    else:
      nll_BxL = token_logprobs.vocab_chunked_nll(hidden_BxLxD, params["lm_head"]["kernel"],
                                                 batch["targets"], vocab_chunk)
    if cfg.num_mtp_layers and not mtp.vocab_chunk:  # the MTP loss's full-logits reference
      logits_BxLxV = model.head(cfg, params, hidden_BxLxD)
  else:
    if cfg.num_mtp_layers:
      logits_BxLxV, aux, _, hidden_BxLxD = mtp_lib.forward_with_hidden(
          cfg, params, batch["inputs"], **kwargs)
    else:
      logits_BxLxV, aux, _ = model.apply(cfg, params, batch["inputs"], **kwargs)
    nll_BxL = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, batch["targets"])
  mask_BxL = batch["loss_mask"].astype(jnp.float32)
  ce = (nll_BxL * mask_BxL).sum() / jnp.maximum(totals["tokens"], 1.0)
  # The balance loss is a mean over this batch's valid rows: weighted by their share.
  row_share = _valid_rows(batch["segment_ids"]) / jnp.maximum(totals["rows"], 1.0)
  aux_loss = aux["aux_loss"] * row_share
  loss = ce + aux_loss
  stats = {"ce_loss": ce, "aux_loss": aux_loss, "tokens": mask_BxL.sum(),
           "expert_loads": aux["expert_loads"],
           # Expert-parallel capacity drops, all MoE layers (0 without EP or with no cap).
           "dropped_copies": aux["dropped_copies"].sum()}
  if cfg.num_mtp_layers:
    mtp_loss, mtp_metrics, mtp_moe = mtp_lib.loss(
        cfg, params, batch["inputs"], hidden_BxLxD,
        None if mtp.vocab_chunk else logits_BxLxV,
        targets_BxL=batch["targets"], loss_mask_BxL=batch["loss_mask"],
        kl_weight=mtp.kl_weight, ce_weight=mtp.ce_weight, frozen_trunk=mtp.frozen_trunk,
        counts_Dm=totals["mtp_positions"], vocab_chunk=mtp.vocab_chunk, **kwargs)
    mtp_aux_loss = mtp_moe["aux_loss"] * row_share
    loss = loss + mtp_loss + mtp_aux_loss
    stats.update(mtp_metrics, mtp_loss=mtp_loss, mtp_expert_loads=mtp_moe["expert_loads"],
                 aux_loss=aux_loss + mtp_aux_loss)
  return loss, stats


def _grads(cfg, params, batch: Batch, mtp: MTPWeights, totals: dict, vocab_chunk: int,
           loss_impl: str):
  """(loss, stats), grads of loss_fn; a frozen trunk is differentiated only through the
  MTP subtree (so no backward pass runs through the trunk) and gets zero gradients."""
  if not (cfg.num_mtp_layers and mtp.frozen_trunk):
    return jax.value_and_grad(
        lambda p: loss_fn(cfg, p, batch, mtp, totals, vocab_chunk, loss_impl),
        has_aux=True)(params)
  def of_mtp(mtp_params):
    return loss_fn(cfg, {**params, mtp_lib.PARAMS_KEY: mtp_params}, batch, mtp, totals,
                   vocab_chunk, loss_impl)
  value, mtp_grads = jax.value_and_grad(of_mtp, has_aux=True)(params[mtp_lib.PARAMS_KEY])
  grads = {**jax.tree.map(jnp.zeros_like, params), mtp_lib.PARAMS_KEY: mtp_grads}
  return value, grads


def train_step(cfg, optimizer, state: TrainState, batch: Batch, mtp: MTPWeights | None = None,
               microbatches: int = 1, vocab_chunk: int = 0, loss_impl: str = "c2jax"):
  """One optimizer step, then the aux-loss-free correction-bias update (outside Adam).

  `mtp` (default MTPWeights()) matters only when cfg.num_mtp_layers > 0. `microbatches`:
  gradients accumulated over that many slices of the batch (its rows must divide by it).
  `vocab_chunk`, `loss_impl`: how the cross entropy is computed (loss_fn).
  """
  mtp = mtp or MTPWeights()
  totals = batch_totals(cfg, batch)
  (loss, stats), grads = accumulate.value_and_grad(
      lambda micro: _grads(cfg, state.params, micro, mtp, totals, vocab_chunk, loss_impl),
      state.params, batch, microbatches)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  frozen = bool(cfg.num_mtp_layers) and mtp.frozen_trunk
  if frozen:  # zero gradients alone would still let weight decay move the trunk
    updates = {key: (value if key == mtp_lib.PARAMS_KEY
                     else jax.tree.map(jnp.zeros_like, value))
               for key, value in updates.items()}
  params = optax.apply_updates(state.params, updates)
  if cfg.num_layers > cfg.first_k_dense and cfg.moe.router == "sigmoid_bias":
    rate = cfg.moe.bias_update_rate
    # Each stack's biases follow its own loads: the trunk's (unless frozen) and the MTP
    # blocks' (MoE exactly when the trunk has MoE layers; they train even when frozen).
    main = {k: v for k, v in params.items() if k != mtp_lib.PARAMS_KEY}
    if not frozen:
      main = moe.update_correction_bias(main, stats["expert_loads"], rate)
    params = {**params, **main}
    if cfg.num_mtp_layers:
      params[mtp_lib.PARAMS_KEY] = moe.update_correction_bias(
          params[mtp_lib.PARAMS_KEY], stats["mtp_expert_loads"], rate)
  metrics = {"loss": loss, "ce_loss": stats["ce_loss"], "aux_loss": stats["aux_loss"],
             "tokens": stats["tokens"], "grad_norm": optax.tree_utils.tree_norm(grads),
             "dropped_copies": stats["dropped_copies"]}
  if cfg.num_mtp_layers:  # scalars only: the MTP expert loads are not a metric
    metrics.update({k: v for k, v in stats.items() if k.startswith("mtp") and v.ndim == 0})
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics
