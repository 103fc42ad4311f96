"""CpuDecodeLayout: how a JaxEngine on one CPU device keeps its weights and cache, where
that pays (decode_layout_pays), as a c2jax.rollout.decode_layout strategy.

XLA:CPU copies a weight it slices out of a stacked array, per step, so the layout keeps
one array per layer (model.unstack_layers; the layers run as a Python loop and XLA reads
every weight in place), per routed expert when unquantised, or a layer's experts fused
when they are small (fused_experts_pay); the KV cache per layer too (without speculation,
whose programs keep the stacked cache), read and written in place; and, when the weights
stream from memory, each projection kernel in the form measured fastest at the step's
rows on this machine (measure.projection_layout, forms.py).
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from c2jax import model
from c2jax.rollout.cpu_decode import forms, measure

# A MoE layer's routed expert weights up to which a decode engine fuses them
# (fused_experts_pay).
FUSED_EXPERTS_MAX_BYTES = 1 << 20


def fused_experts_pay(cfg) -> bool:
  """Whether a CPU decode engine stores each MoE layer's routed experts fused
  (model.unstack_layers(..., fuse_experts=True)) and runs every expert on every token
  of a decode step (moe_dispatch.all_experts: three ops a layer), rather than reading
  only the chosen experts (one array per expert, moe_dispatch.per_expert: a few ops per
  chosen expert): when a layer's routed experts take at most FUSED_EXPERTS_MAX_BYTES.

  Measured (2026-12-02, the 2-core AMD VM; docs/benchmarks.md) on whole 64-step decode
  loops, fused / per expert: `qwen3_moe_tiny` (8 experts of 64 x 32, 0.2 MB a layer)
  1.39x, 1.12-1.18x and 0.96-1.03x at batch 1, 8 and 32; `qwen3_moe_small` (16 experts
  of 512 x 256, 25 MB a layer) 0.47x, 0.70x and 0.72x, where the E / K times more
  weight reads and FLOPs dominate. Unquantised only."""
  if cfg.num_layers == cfg.first_k_dense or cfg.quant != "none":
    return False
  moe = cfg.moe
  layer_bytes = (3 * moe.num_experts * cfg.hidden_size * moe.intermediate_size
                 * np.dtype(cfg.param_dtype).itemsize)
  return layer_bytes <= FUSED_EXPERTS_MAX_BYTES


def decode_layout_pays(cfg, tokens_per_step: int) -> bool:
  """Whether the CPU decode layout (model.unstack_layers) beats the stacked tree for
  decode steps of `tokens_per_step` tokens.

  Without MoE layers (dense models) always: a scanned dense layer's every weight is
  copied out of the stack per step, and nothing else differs (measured 2026-11-27 at
  qwen3_small, tools/bench/decode_layout.py; docs/benchmarks.md, "Decode against the
  JAX peers"). With MoE layers whose experts the engine fuses (fused_experts_pay),
  always: the fused layers are one array each. Other MoE layers, when the steps choose at
  least half a MoE layer's experts' worth of token copies. Below that the stacked tree's
  'gathered' dispatch copies only a few experts' weights, which costs less than the
  unrolled layers' own overhead (measured 2026-11-26 at small, one compiled chunk, quiet:
  the layout ran 0.75x / 0.89x / 1.01x / 1.6-1.85x / 1.24-1.45x the stacked tree at batch
  1 / 2 / 4 / 8 / 32)."""
  moe = cfg.moe
  if cfg.num_layers == cfg.first_k_dense or fused_experts_pay(cfg):
    return True
  return 2 * tokens_per_step * moe.num_experts_per_tok >= moe.num_experts


class CpuDecodeLayout:
  """The per-layer decode layout (module docstring). `projection_layout`: None (every
  kernel as model.init stores it) or measure.projection_layout's choice; `per_layer_cache`:
  the KV cache per layer too (not with speculation)."""

  def __init__(self, *, split_experts: bool, fuse_experts: bool, projection_layout=None,
               per_layer_cache: bool = True):
    self._unstack = functools.partial(model.unstack_layers, split_experts=split_experts,
                                      fuse_experts=fuse_experts)
    self._projection_layout = projection_layout
    self._per_layer_cache = per_layer_cache
    self._to_layout = jax.jit(self._lay_out)
    chosen = projection_layout.chosen if projection_layout else {}
    # {(inputs, outputs): form} of the kernels stored another way ({} when none).
    self.forms = {shape: form for shape, form in chosen.items() if form != 1}

  @classmethod
  def choose(cls, cfg, params, *, num_slots: int, num_draft: int,
             placement) -> CpuDecodeLayout | None:
    """The layout for an engine of `num_slots` slots drafting `num_draft` tokens a step
    over `params` (model.init's tree), or None: on a mesh (whose sharding rules name the
    stacked tree), off CPU, or where it does not pay at the step's tokens."""
    if placement is not None or jax.default_backend() != "cpu":
      return None
    if not decode_layout_pays(cfg, num_slots * (1 + num_draft)):
      return None
    # Projection forms not when quantised, nor when speculating (the MTP drafter reads
    # the LM head's kernel).
    projection_layout = None
    if cfg.quant == "none" and not num_draft:
      projection_layout = measure.projection_layout(cfg, params, num_slots)
    fuse = fused_experts_pay(cfg)  # small experts fused; quantised experts stay stacked
    return cls(split_experts=cfg.quant == "none" and not fuse, fuse_experts=fuse,
               projection_layout=projection_layout, per_layer_cache=not num_draft)

  def _lay_out(self, stacked):
    return forms.relayout(self._unstack(stacked), self._projection_layout)

  def to_layout(self, stacked_params):
    """The engine's tree from model.init's stacked one (one compiled program)."""
    return self._to_layout(stacked_params)

  def make_cache(self, cfg, num_slots: int, max_length: int):
    """The zeroed KV cache, per layer unless speculating."""
    cache = model.init_cache(cfg, num_slots, max_length)
    return model.unstack_layers(cache) if self._per_layer_cache else cache
