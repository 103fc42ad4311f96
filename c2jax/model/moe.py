"""Mixture-of-Experts layer (DeepSeek-V3 / Kimi-K2.5 and Qwen3-MoE), the public face.

y = shared(x) + sum_k w_k expert_{i_k}(x), with experts chosen by a router from ROUTERS
(cfg.moe.router) and run by a dispatch implementation from DISPATCH (cfg.moe_impl), whose
expert matmuls use the quantisation recipe cfg.quant (c2jax.quant.RECIPES).
Routing lives in moe_routing.py, dispatch in moe_dispatch.py (moe_dispatch.select:
calls with few tokens, such as decode steps, gather just the chosen experts' weights, and
calls against a KV cache never compute every expert densely);
under an ambient mesh that splits the logical 'expert' axis, the dispatch runs expert
parallel (all-to-all token exchange, c2jax.parallel.expert) unless
cfg.moe.expert_parallel = 'off'.

Parameters (under the layer's `moe/` scope; the enclosing scan adds a leading 'layers'):
  router/kernel            [D, E]        ('embed', 'expert')
  router/correction_bias   [E] float32   ('expert',)  only for routers that use one;
                           selection-only, stop_gradient in the forward, trained by
                           `update_correction_bias` outside the optimizer
  experts/gate_proj        [E, D, Fe]    ('expert', 'embed', 'expert_mlp')
  experts/up_proj          [E, D, Fe]
  experts/down_proj        [E, Fe, D]    ('expert', 'expert_mlp', 'embed')
  shared/{gate,up,down}_proj/kernel      one SwiGLU MLP of width S*Fe (iff S > 0)

Einsum legend: B batch, L length, T = B*L tokens, D hidden, E experts, K experts per
token, Fe expert width.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

import c2jax_kernels as kernels
from c2jax.model import layers
from c2jax.model import moe_dispatch
from c2jax.model import moe_routing
from c2jax.model.moe_dispatch import DISPATCH, FUSED_GATE_UP, ExpertWeights
from c2jax.model.moe_routing import ROUTERS
from c2jax.parallel import expert as expert_parallel
from c2jax_kernels import weight_quant

__all__ = ["DISPATCH", "EXPERT_WEIGHTS", "ROUTERS", "ExpertWeights", "MoE",
           "is_routed_expert", "update_correction_bias"]

_BIAS_NAME = "correction_bias"
# The routed experts' stacked weights, parameter leaves .../moe/experts/<name> (the MTP
# module's too): what released checkpoints quantise and an inference engine may hold
# quantised (engine.weights_quant).
EXPERT_WEIGHTS = ("gate_proj", "up_proj", "down_proj")


def is_routed_expert(path: tuple[str, ...]) -> bool:
  """Whether the parameter leaf at `path` (its keys) is a routed expert's weight."""
  return len(path) >= 3 and tuple(path[-3:-1]) == ("moe", "experts") and (
      path[-1] in EXPERT_WEIGHTS)


class Router(nn.Module):
  """Router parameters and float32 logits (HF computes DeepSeek-V3's in float32)."""
  cfg: Any

  @nn.compact
  def __call__(self, x_TxD: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    cfg = self.cfg
    num_experts = cfg.moe.num_experts
    kernel_DxE = layers.logical_param(
        self, "kernel", nn.initializers.normal(cfg.init_std),
        (cfg.hidden_size, num_experts), ("embed", "expert"), layers.param_dtype(cfg))
    logits_TxE = jnp.einsum("td,de->te", x_TxD.astype(jnp.float32),
                            kernel_DxE.astype(jnp.float32))
    bias_E = None
    if ROUTERS[cfg.moe.router].uses_correction_bias:
      # float32 whatever param_dtype is: the balancing update's steps are tiny.
      bias_E = jax.lax.stop_gradient(layers.logical_param(
          self, _BIAS_NAME, nn.initializers.zeros, (num_experts,), ("expert",),
          jnp.float32))
    return logits_TxE, bias_E


class Experts(nn.Module):
  """The routed experts' stacked SwiGLU weights, run by the configured dispatch.

  Returns (y_TxD, dropped int32 scalar). With cfg.moe.expert_parallel 'auto' and an
  ambient mesh whose logical 'expert' axis spans > 1 device, the experts run expert
  parallel (c2jax.parallel.expert), which may drop token copies over capacity; otherwise
  the dispatch runs as is and drops nothing.
  """
  cfg: Any

  @nn.compact
  def __call__(self, x_TxD, weights_TxK, indices_TxK,
               decoding: bool = False) -> tuple[jax.Array, jax.Array]:
    cfg = self.cfg
    e, d, f = cfg.moe.num_experts, cfg.hidden_size, cfg.moe.intermediate_size
    dtype = layers.compute_dtype(cfg)

    def weight(name, shape, axes):
      if self.has_variable("params", name):
        stored = self.get_variable("params", name)
        if weight_quant.is_quantized(stored):
          # Held quantised by an inference engine (engine.weights_quant): the dispatch
          # dequantises a tile at a time (moe_dispatch.grouped_experts).
          if stored.shape != shape:
            raise ValueError(f"experts/{name}: quantised weights of shape {stored.shape}, "
                             f"the config needs {shape}.")
          return stored
        if isinstance(stored, (tuple, list)):
          # One array per expert (model.unstack_layers(..., split_experts=True)).
          if len(stored) != e or any(w.shape != shape[1:] for w in stored):
            raise ValueError(f"experts/{name}: split weights need {e} arrays of shape "
                             f"{shape[1:]}; got {[w.shape for w in stored]}.")
          return tuple(w.astype(dtype) for w in stored)
      value = layers.logical_param(self, name, nn.initializers.normal(cfg.init_std), shape,
                                   axes, layers.param_dtype(cfg))
      return value.astype(dtype)

    fused = None
    if self.has_variable("params", FUSED_GATE_UP):
      # Gate and up of every expert side by side, [D, 2, E, F] (model.unstack_layers(...,
      # fuse_experts=True)): every expert on every token for a few tokens
      # (moe_dispatch.all_experts); more tokens get the stacked weights back (a copy of
      # small weights, which only fused_experts_pay layouts fuse) and the usual dispatch.
      fused = self.get_variable("params", FUSED_GATE_UP)
      if fused.shape != (d, 2, e, f):
        raise ValueError(f"experts/{FUSED_GATE_UP}: fused weights need shape {(d, 2, e, f)} "
                         f"(hidden, gate and up, experts, expert width); got {fused.shape}.")
      if cfg.quant != "none":
        raise ValueError("Fused expert weights (model.unstack_layers(..., fuse_experts=True)) "
                         f"run unquantised; with quant = {cfg.quant!r} keep the experts "
                         "stacked (unstack_layers without fuse_experts).")
      fused = fused.astype(dtype)
      if x_TxD.shape[0] <= moe_dispatch.ALL_EXPERTS_MAX_TOKENS:
        down = weight("down_proj", (e, f, d), moe_dispatch.EXPERT_AXES.down_ExFxD)
        return (moe_dispatch.all_experts(x_TxD.astype(dtype), weights_TxK, indices_TxK, fused,
                                         down), jnp.zeros((), jnp.int32))
    axes = moe_dispatch.EXPERT_AXES
    if fused is not None:
      experts = ExpertWeights(*moe_dispatch.unfuse_gate_up(fused),
                              down_ExFxD=weight("down_proj", (e, f, d), axes.down_ExFxD))
    else:
      experts = ExpertWeights(
          gate_ExDxF=weight("gate_proj", (e, d, f), axes.gate_ExDxF),
          up_ExDxF=weight("up_proj", (e, d, f), axes.up_ExDxF),
          down_ExFxD=weight("down_proj", (e, f, d), axes.down_ExFxD))
    x_TxD = x_TxD.astype(dtype)
    plan = (expert_parallel.plan_from_context() if cfg.moe.expert_parallel == "auto"
            else None)
    if moe_dispatch.is_quantized(experts):
      return self._quantized(x_TxD, weights_TxK, indices_TxK, experts, plan)
    split = moe_dispatch.is_split(experts)
    if split and plan is not None:
      raise ValueError("Expert-parallel MoE needs the stacked expert weights; split them "
                       "(model.unstack_layers(..., split_experts=True)) only off a mesh.")
    if plan is None:
      dispatch = moe_dispatch.select(cfg.moe_impl, cfg.quant, x_TxD.shape[0],
                                     indices_TxK.shape[1], e, decoding=decoding, split=split)
      kernel_dispatch = dispatch is moe_dispatch.pallas
      dispatch = moe_dispatch.with_kernel(dispatch, cfg.grouped_matmul_impl)
      token_axes = expert_parallel.token_axes_from_context()
      if kernel_dispatch and token_axes and kernels.target_platform() != "cpu":
        # Mosaic kernels (TPU, GPU) are custom calls XLA cannot partition over the tokens'
        # shards; on the CPU they are interpreted as plain, partitionable XLA.
        y_TxD = expert_parallel.token_local_forward(
            x_TxD, weights_TxK, indices_TxK, experts, token_axes, local_dispatch=dispatch,
            quant=cfg.quant, logical_axes=None if split else axes)
      else:
        y_TxD = dispatch(x_TxD, weights_TxK, indices_TxK, experts, quant=cfg.quant)
      return y_TxD, jnp.zeros((), jnp.int32)
    return expert_parallel.moe_forward(
        x_TxD, weights_TxK, indices_TxK, experts, plan,
        local_dispatch=moe_dispatch.with_kernel(DISPATCH[cfg.moe_impl],
                                                cfg.grouped_matmul_impl),
        quant=cfg.quant, capacity_factor=cfg.moe.ep_capacity_factor,
        dispatch_quant=cfg.moe.ep_dispatch_quant, logical_axes=axes,
        exchange=cfg.moe.ep_exchange, local_grouped=functools.partial(
            moe_dispatch.grouped_experts,
            impl=moe_dispatch.grouped_impl(cfg.moe_impl, cfg.grouped_matmul_impl)))


  def _quantized(self, x_TxD, weights_TxK, indices_TxK, experts, plan):
    """Experts held quantised (kernels.weight_quant): the sorted 'ragged' dispatch, whose
    grouped matmuls dequantise a tile at a time, locally or inside expert parallelism
    (the scales split like their weights wherever their blocks divide)."""
    cfg = self.cfg
    if cfg.quant != "none":
      raise ValueError(f"model.quant = {cfg.quant!r} with quantised resident expert weights "
                       "(engine.weights_quant): an engine runs them with quant = 'none'.")
    if plan is None:
      return (moe_dispatch.DISPATCH["ragged"](x_TxD, weights_TxK, indices_TxK, experts),
              jnp.zeros((), jnp.int32))
    axes = moe_dispatch.ExpertWeights(*(
        weight_quant.WeightQuant(names, names, w.scheme, w.block)
        if weight_quant.is_quantized(w) else names
        for w, names in zip(experts, moe_dispatch.EXPERT_AXES)))
    return expert_parallel.moe_forward(
        x_TxD, weights_TxK, indices_TxK, experts, plan,
        local_dispatch=moe_dispatch.DISPATCH["ragged"],
        capacity_factor=cfg.moe.ep_capacity_factor,
        dispatch_quant=cfg.moe.ep_dispatch_quant, logical_axes=axes,
        exchange=cfg.moe.ep_exchange, local_grouped=functools.partial(
            moe_dispatch.grouped_experts, impl="ragged_dot"))


class MoE(nn.Module):
  """Routed experts (+ shared experts) with router replay and routing statistics.

  __call__(x_BxLxD, routing_BxLxK=None, valid_BxL=None, decoding=False) -> (y_BxLxD, stats):
    decoding: the call runs against a KV cache (inference); moe_dispatch.select then
      never picks the dense reference dispatch.
    routing_BxLxK: int32 expert indices in [0, E) to use instead of the router's choice
      (router replay); gate weights are still gathered from the live scores, so the
      router kernel gets gradients.
    valid_BxL: optional bool mask; False tokens (padding) are still computed but left out
      of expert_loads and aux_loss.
    stats: {'expert_loads': float32 [E] token copies per expert,
            'expert_indices': int32 [B, L, K] experts used,
            'aux_loss': float32 scalar, sequence-wise balance loss * cfg.moe.aux_loss_coef,
            'dropped_copies': float32 scalar, token copies dropped over expert-parallel
              capacity (cfg.moe.ep_capacity_factor), all tokens (padding included)}
  """
  cfg: Any

  @nn.compact
  def __call__(self, x_BxLxD, routing_BxLxK=None, valid_BxL=None, decoding: bool = False):
    cfg, moe_cfg = self.cfg, self.cfg.moe
    batch, length, hidden = x_BxLxD.shape
    top_k = moe_cfg.num_experts_per_tok
    if routing_BxLxK is not None and routing_BxLxK.shape != (batch, length, top_k):
      raise ValueError(
          f"MoE router replay: routing has shape {routing_BxLxK.shape}, expected "
          f"[batch, length, num_experts_per_tok] = {(batch, length, top_k)}; pass the "
          "expert indices the engine recorded for this layer.")
    x_BxLxD = layers.constrain(x_BxLxD, ("batch", "length", "embed"))
    x_TxD = x_BxLxD.reshape(batch * length, hidden)

    logits_TxE, bias_E = Router(cfg, name="router")(x_TxD)
    replay_TxK = None if routing_BxLxK is None else routing_BxLxK.reshape(-1, top_k)
    valid_T = None if valid_BxL is None else valid_BxL.reshape(-1)
    routing = moe_routing.route(logits_TxE, bias_E, moe_cfg, replay_TxK, valid_T)

    y_TxD, dropped = Experts(cfg, name="experts")(x_TxD, routing.weights_TxK,
                                                  routing.indices_TxK, decoding)
    y_BxLxD = y_TxD.reshape(batch, length, hidden)
    if moe_cfg.num_shared_experts > 0:
      shared = layers.MLP(moe_cfg.num_shared_experts * moe_cfg.intermediate_size, cfg,
                          name="shared")
      y_BxLxD = y_BxLxD + shared(x_BxLxD)
    y_BxLxD = layers.constrain(y_BxLxD, ("batch", "length", "embed"))
    return y_BxLxD, self._stats(routing, batch, length, valid_BxL, dropped)

  def _stats(self, routing, batch, length, valid_BxL, dropped) -> dict[str, jax.Array]:
    moe_cfg = self.cfg.moe
    indices_BxLxK = routing.indices_TxK.reshape(batch, length, -1)
    if moe_cfg.aux_loss_coef > 0:
      scores_BxLxE = routing.scores_TxE.reshape(batch, length, -1)
      aux_loss = moe_cfg.aux_loss_coef * moe_routing.sequence_balance_loss(
          scores_BxLxE, indices_BxLxK, valid_BxL)
    else:  # skip the work entirely when the loss is off (aux-loss-free balancing)
      aux_loss = jnp.zeros((), jnp.float32)
    zero = jnp.zeros((), jnp.float32)
    return {
        "expert_loads": moe_routing.expert_loads(indices_BxLxK, moe_cfg.num_experts,
                                                 valid_BxL),
        "expert_indices": indices_BxLxK,
        "aux_loss": aux_loss,
        "dropped_copies": dropped.astype(jnp.float32),
        "replay_replaced": zero if routing.replay_replaced is None else routing.replay_replaced,
        "replay_mismatch": zero if routing.replay_mismatch is None else routing.replay_mismatch,
    }


def update_correction_bias(params, expert_loads, rate: float):
  """Aux-loss-free balancing: bias += rate * sign(mean_load - load), outside the optimizer.

  Applies to every `correction_bias` leaf of `params` (plain or logically boxed arrays);
  `expert_loads` must have that leaf's shape, e.g. the model's stacked [Lm, E] loads for
  the stacked [Lm, E] bias. Over-loaded experts become less likely to be chosen,
  under-loaded ones more. Returns a new tree; other leaves are passed through unchanged.
  """
  loads = jnp.asarray(expert_loads, jnp.float32)

  def update(path, leaf):
    if not any(getattr(key, "key", None) == _BIAS_NAME for key in path):
      return leaf
    if leaf.shape != loads.shape:
      name = "/".join(str(key.key) for key in path if hasattr(key, "key"))
      raise ValueError(
          f"update_correction_bias: {name} has shape {leaf.shape} but expert_loads has "
          f"shape {loads.shape}; pass the loads of exactly the layers this bias stacks "
          "(the model's aux['expert_loads']).")
    step = jnp.sign(loads.mean(axis=-1, keepdims=True) - loads)
    return (leaf.astype(jnp.float32) + rate * step).astype(leaf.dtype)

  return jax.tree_util.tree_map_with_path(update, params)
