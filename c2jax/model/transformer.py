"""The decoder-only transformer: embedding, two scanned layer stacks, final norm, LM head.

The first `first_k_dense` layers use a dense SwiGLU MLP, the rest an MoE layer (HF
`first_k_dense_replace`); each kind is one `nn.scan` over a stacked [layers, ...] copy of
its block, so compile time does not grow with depth. Per-layer inputs (router-replay
indices, KV caches) are scan xs; per-layer outputs (routing stats, updated caches) come
out stacked. Each block is optionally rematerialised with a policy from REMAT_POLICIES.

Shape legend: B batch, L length, D hidden, V vocab, Ld / Lm dense / MoE layer counts,
K experts per token, E experts, T cache length.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from c2jax.model import attention as attention_lib
from c2jax.model import moe, moe_dispatch, projections
from c2jax.model.layers import MLP, Embed, Linear, RMSNorm, constrain
from c2jax.model.moe import MoE

# name -> jax checkpoint policy; None means no rematerialisation at all.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.checkpoint_dots,
    "save_dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

_STACKS = ("dense_layers", "moe_layers")


class DecoderBlock(nn.Module):
  """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x)) (dense MLP or MoE)."""
  cfg: object
  use_moe: bool

  @nn.compact
  def __call__(self, x_BxLxD, xs, positions_BxL, segment_ids_BxL):
    routing_BxLxK, cache = xs
    cfg = self.cfg
    attention = attention_lib.ATTENTION[cfg.attention](cfg, name="attn")
    h_BxLxD = RMSNorm(cfg.hidden_size, "embed", cfg, name="attn_norm")(x_BxLxD)
    attn_BxLxD, new_cache = attention(h_BxLxD, positions_BxL, segment_ids_BxL, cache)
    x_BxLxD = constrain(x_BxLxD + attn_BxLxD, ("batch", "length", "embed"))

    h_BxLxD = RMSNorm(cfg.hidden_size, "embed", cfg, name="mlp_norm")(x_BxLxD)
    if self.use_moe:
      # Padding (segment id 0) is computed but kept out of the routing statistics.
      valid_BxL = None if segment_ids_BxL is None else segment_ids_BxL != 0
      mlp_BxLxD, stats = MoE(cfg, name="moe")(h_BxLxD, routing_BxLxK, valid_BxL,
                                              decoding=cache is not None)
    else:
      mlp_BxLxD, stats = MLP(cfg.intermediate_size, cfg, name="mlp")(h_BxLxD), None
    x_BxLxD = constrain(x_BxLxD + mlp_BxLxD, ("batch", "length", "embed"))
    return x_BxLxD, (stats, new_cache)


def _scan_is_a_loop(num_layers: int, unroll: int) -> bool:
  """Whether `lax.scan(length=num_layers, unroll=unroll)` runs every layer inside a while
  loop of two or more trips. It does not when the unroll covers the stack (or leaves a
  remainder, which scan emits as straight-line code) or the stack has one layer (XLA
  inlines a one-trip loop): the forward and the backward pass are then one straight-line
  program."""
  return unroll >= 1 and num_layers % unroll == 0 and num_layers // unroll >= 2


def _block(cfg, in_loop: bool):
  """DecoderBlock, rematerialised by cfg.remat. `in_loop`: each layer runs in the body of a
  real loop (_scan_is_a_loop), where the recomputation cannot be merged with the forward
  pass, so jax.checkpoint's CSE barrier is not needed (jax.checkpoint docs). In
  straight-line code XLA's CSE would merge the recomputed forward with the original one
  and keep every activation alive, undoing the remat: prevent_cse=True there."""
  block = DecoderBlock
  policy_name = cfg.remat
  if policy_name not in REMAT_POLICIES:
    raise ValueError(f"config.remat = {policy_name!r}; choose one of {sorted(REMAT_POLICIES)}.")
  if REMAT_POLICIES[policy_name] is not None:
    block = nn.remat(block, policy=REMAT_POLICIES[policy_name], prevent_cse=not in_loop)
  return block


class UnrolledStack(nn.Module):
  """A layer stack as a Python loop over per-layer blocks named '0', '1', ... (params
  {'0': block params, ...}, see unstack_layers): the scan's contract (per-layer xs in,
  stacked per-layer outputs out), but each layer's weights are their own arrays. XLA:CPU
  copies a scanned layer's weight slice (e.g. a MoE layer's [E, D, F] experts) before a
  matmul or gather reads it; separate arrays are read in place, which is what decode
  steps, bound by reading the weights, need. The KV cache may be stacked (each layer's
  slice is read out and written back) or per layer too ({'0': layer 0's cache, ...}, from
  unstack_layers(cache)), which a decode step reads and writes in place: XLA:CPU copies
  the stacked cache's slices, per layer and step, which grows with batch and context."""
  cfg: object
  use_moe: bool
  num_layers: int

  @nn.compact
  def __call__(self, x_BxLxD, xs, positions_BxL, segment_ids_BxL):
    routing, cache = xs
    per_layer_cache = isinstance(cache, dict) and "0" in cache
    block = _block(self.cfg, in_loop=False)
    stats = []
    for i in range(self.num_layers):
      layer_routing = None if routing is None else routing[i]
      layer_cache = (cache[str(i)] if per_layer_cache
                     else jax.tree.map(lambda a, i=i: a[i], cache))
      x_BxLxD, (layer_stats, layer_cache) = block(self.cfg, self.use_moe, name=str(i))(
          x_BxLxD, (layer_routing, layer_cache), positions_BxL, segment_ids_BxL)
      stats.append(layer_stats)
      if per_layer_cache:
        cache = {**cache, str(i): jax.tree.map(lambda c, r: r.astype(c.dtype),
                                               cache[str(i)], layer_cache)}
      elif cache is not None:
        cache = jax.tree.map(
            lambda c, r, i=i: jax.lax.dynamic_update_index_in_dim(c, r.astype(c.dtype), i, 0),
            cache, layer_cache)
    stacked_stats = jax.tree.map(lambda *leaves: jnp.stack(leaves), *stats)
    return x_BxLxD, (stacked_stats, cache)


def _stack(cfg, use_moe: bool, num_layers: int, name: str) -> nn.Module:
  block = _block(cfg, in_loop=_scan_is_a_loop(num_layers, cfg.scan_unroll))
  scanned = nn.scan(
      block,
      variable_axes={"params": 0},
      split_rngs={"params": True},
      in_axes=(0, nn.broadcast, nn.broadcast),
      length=num_layers,
      unroll=cfg.scan_unroll,
      metadata_params={nn.PARTITION_NAME: "layers"},
  )
  return scanned(cfg, use_moe, name=name)


class Transformer(nn.Module):
  """See the model contract: returns (logits_BxLxV float32, aux, new_cache).
  unrolled_layers: the layer stacks are UnrolledStack (params from unstack_layers) in
  place of scans over stacked params; same function, same numerics."""
  cfg: object
  unrolled_layers: bool = False

  @nn.compact
  def __call__(self, tokens_BxL, positions_BxL=None, segment_ids_BxL=None, routing=None,
               cache=None, head: bool = True):
    """head=False returns the final-normed hidden state [B, L, D] in place of the logits
    (for losses that apply params['lm_head'] themselves, e.g. chunked token log-probs)."""
    cfg = self.cfg
    batch, length = tokens_BxL.shape
    num_dense = cfg.first_k_dense
    num_moe = cfg.num_layers - num_dense
    top_k = cfg.moe.num_experts_per_tok
    if positions_BxL is None:
      if cache is not None:
        raise ValueError("Decoding with a cache needs explicit positions_BxL (the cache slot "
                         "of each new token); pass e.g. the current length of each row.")
      positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    if routing is not None and routing.shape != (num_moe, batch, length, top_k):
      raise ValueError(
          f"routing has shape {routing.shape}; router replay needs int32 [MoE layers, batch, "
          f"length, num_experts_per_tok] = {(num_moe, batch, length, top_k)}.")
    stacks = {name for name, count in zip(_STACKS, (num_dense, num_moe)) if count}
    if cache is not None and set(cache) != stacks:
      raise ValueError(f"cache has stacks {sorted(cache)}; build it with "
                       "c2jax.model.init_cache(cfg, batch, max_length) for this config.")

    x_BxLxD = Embed(cfg, name="embed")(tokens_BxL)
    new_cache = None if cache is None else {}
    stats = None
    for name, use_moe, count in (("dense_layers", False, num_dense),
                                 ("moe_layers", True, num_moe)):
      if count == 0:
        continue
      xs = (routing if use_moe else None, None if cache is None else cache[name])
      stack = (UnrolledStack(cfg, use_moe, count, name=name) if self.unrolled_layers
               else _stack(cfg, use_moe, count, name))
      x_BxLxD, (layer_stats, layer_cache) = stack(x_BxLxD, xs, positions_BxL,
                                                  segment_ids_BxL)
      if use_moe:
        stats = layer_stats
      if cache is not None:
        new_cache[name] = layer_cache

    x_BxLxD = RMSNorm(cfg.hidden_size, "embed", cfg, name="final_norm")(x_BxLxD)
    if not head:
      return x_BxLxD, _aux(cfg, stats, batch, length), new_cache
    logits_BxLxV = lm_head(cfg)(x_BxLxD)
    logits_BxLxV = constrain(logits_BxLxV, ("batch", "length", "vocab"))
    return logits_BxLxV, _aux(cfg, stats, batch, length), new_cache


def lm_head(cfg, name: str | None = "lm_head") -> Linear:
  """The output projection (hidden [..., D] -> float32 logits [..., V]) as a module: inside
  Transformer it owns params['lm_head']; alone, `lm_head(cfg, None).apply({'params':
  params['lm_head']}, hidden)` applies the same weights the same way (model.head)."""
  return Linear((cfg.hidden_size,), (cfg.vocab_size,), ("embed", "vocab"), cfg,
                out_dtype="float32", name=name)


def _aux(cfg, stats, batch: int, length: int) -> dict[str, jax.Array]:
  """Stacked per-MoE-layer stats; empty [0, ...] arrays when the model has no MoE layers."""
  if stats is None:
    return {"expert_loads": jnp.zeros((0, cfg.moe.num_experts), jnp.float32),
            "expert_indices": jnp.zeros((0, batch, length, cfg.moe.num_experts_per_tok),
                                        jnp.int32),
            "aux_loss": jnp.zeros((), jnp.float32),
            "dropped_copies": jnp.zeros((0,), jnp.float32),
            "replay_replaced": jnp.zeros((0,), jnp.float32),
            "replay_mismatch": jnp.zeros((0,), jnp.float32)}
  return {"expert_loads": stats["expert_loads"].astype(jnp.float32),
          "expert_indices": stats["expert_indices"].astype(jnp.int32),
          "aux_loss": jnp.sum(stats["aux_loss"]).astype(jnp.float32),
          "dropped_copies": stats["dropped_copies"].astype(jnp.float32),
          # Router replay filter, per MoE layer (0 without replay or filter).
          "replay_replaced": stats["replay_replaced"].astype(jnp.float32),
          "replay_mismatch": stats["replay_mismatch"].astype(jnp.float32)}


def init_cache(cfg, batch: int, max_length: int, dtype=None) -> dict:
  """Zeroed decode cache: {'dense_layers'|'moe_layers': per-stack stacked layer caches}."""
  dtype = jnp.dtype(cfg.dtype if dtype is None else dtype)
  counts = {"dense_layers": cfg.first_k_dense,
            "moe_layers": cfg.num_layers - cfg.first_k_dense}
  return {name: attention_lib.init_layer_cache(cfg, count, batch, max_length, dtype)
          for name, count in counts.items() if count}


def cache_axes(cfg) -> dict:
  """Logical axis names for every array of `init_cache(cfg, ...)` (same tree)."""
  counts = {"dense_layers": cfg.first_k_dense,
            "moe_layers": cfg.num_layers - cfg.first_k_dense}
  return {name: attention_lib.layer_cache_axes(cfg) for name, count in counts.items()
          if count}


def unstack_layers(params, split_experts: bool = False, fuse_experts: bool = False) -> dict:
  """`params` (model.init's tree) with each stacked layer stack [layers, ...] split into
  {'0': layer 0's params, '1': ...}: the tree Transformer(unrolled_layers=True) reads.
  A cache (init_cache's tree) splits the same way, into the per-layer caches it also
  reads (a layer's cache leaves are then [B, T, ...]).
  split_experts: also split each MoE layer's routed expert weights [E, ...] into a tuple
  of E arrays, run by moe_dispatch.per_expert (unquantised, off a mesh: decode engines).
  fuse_experts: instead, store each MoE layer's routed gate and up weights as one
  [D, 2, E, F] array ('gate_up_proj'; down_proj stays [E, F, D]), run by
  moe_dispatch.all_experts: every expert on every token in three ops a layer, for decode
  engines whose experts are small.
  Other entries (embedding, norms, routers, LM head, 'mtp_layers') are kept as they are;
  store_projections then stores the layers' projection kernels in other forms."""
  if split_experts and fuse_experts:
    raise ValueError("unstack_layers: split_experts and fuse_experts are two layouts of the "
                     "same expert weights; pass at most one.")
  out = dict(params)
  for name in _STACKS:
    if name in params:
      count = jax.tree.leaves(params[name])[0].shape[0]
      per_layer = [jax.tree.map(lambda a, i=i: a[i], params[name]) for i in range(count)]
      if split_experts and name == "moe_layers":
        per_layer = [_map_experts(layer, lambda w: tuple(w[e] for e in range(w.shape[0])))
                     for layer in per_layer]
      if fuse_experts and name == "moe_layers":
        per_layer = [_fuse_experts(layer) for layer in per_layer]
      out[name] = {str(i): layer for i, layer in enumerate(per_layer)}
  return out


def store_projections(params, store) -> dict:
  """unstack_layers' tree with each layer's and the LM head's projection kernel stored as
  store(name, kernel, n_in) -> {param name: stored value} says (`name` e.g. 'down_proj' or
  'lm_head', `kernel` as model.init stores it, `n_in` its input axes; return {'kernel':
  kernel} to keep it): how a decode engine keeps its kernels in forms it registered
  (c2jax.model.projections). Embedding, norms, routers, experts and 'mtp_layers' stay;
  stack_layers undoes it."""
  if not has_unstacked_layers(params):
    raise ValueError("store_projections: takes unstack_layers(params)' per-layer tree; got "
                     "stacked layers (unstack them first).")
  out = dict(params)
  for name in _STACKS:
    if name in params:
      out[name] = {i: projections.relayout(layer, store) for i, layer in params[name].items()}
  if "lm_head" in params:
    out["lm_head"] = projections.relayout({"lm_head": params["lm_head"]}, store)["lm_head"]
  return out


def stack_layers(params) -> dict:
  """Inverse of unstack_layers (split or fused experts) and of store_projections."""
  out = projections.join(dict(params))
  for name in _STACKS:
    if name in params:
      per_layer = [out[name][str(i)] for i in range(len(params[name]))]
      if name == "moe_layers":
        per_layer = [_map_experts(_unfuse_experts(layer), lambda w: jnp.stack(w)
                                  if isinstance(w, (tuple, list)) else w)
                     for layer in per_layer]
      out[name] = jax.tree.map(lambda *leaves: jnp.stack(leaves), *per_layer)
  return out


def projection_shapes(params) -> set[tuple[str, tuple[int, ...], tuple[int, ...]]]:
  """(name, in_shape, out_shape) of each projection kernel in `params` (model.init's tree)
  that store_projections asks about, per layer (without a stack's layer axis)."""
  found = set()
  for name in _STACKS:
    if name in params:
      projections.kernel_shapes(params[name], True, found)
  if "lm_head" in params:
    projections.kernel_shapes({"lm_head": params["lm_head"]}, False, found)
  return found


def _map_experts(layer, fn):
  """`layer` with fn applied to each routed expert weight (layer['moe']['experts'])."""
  experts = layer["moe"]["experts"]
  new = {k: fn(v) if k in moe.EXPERT_WEIGHTS else v for k, v in experts.items()}
  return {**layer, "moe": {**layer["moe"], "experts": new}}


def _fuse_experts(layer):
  """`layer` with its routed experts' gate_proj and up_proj [E, D, F] as one
  gate_up_proj [D, 2, E, F]."""
  experts = dict(layer["moe"]["experts"])
  experts[moe_dispatch.FUSED_GATE_UP] = moe_dispatch.fuse_gate_up(experts.pop("gate_proj"),
                                                                  experts.pop("up_proj"))
  return {**layer, "moe": {**layer["moe"], "experts": experts}}


def _unfuse_experts(layer):
  """Inverse of _fuse_experts (a layer without fused experts comes back as it is)."""
  experts = dict(layer["moe"]["experts"])
  if moe_dispatch.FUSED_GATE_UP not in experts:
    return layer
  experts["gate_proj"], experts["up_proj"] = moe_dispatch.unfuse_gate_up(
      experts.pop(moe_dispatch.FUSED_GATE_UP))
  return {**layer, "moe": {**layer["moe"], "experts": experts}}


def has_unstacked_layers(params) -> bool:
  """Whether `params` holds unstack_layers' per-layer trees."""
  return any(name in params and "0" in params[name] for name in _STACKS)


def transformer_for(cfg, params) -> Transformer:
  """The Transformer module that reads `params`: stacked (model.init) or unstacked."""
  return Transformer(cfg, unrolled_layers=has_unstacked_layers(params))
