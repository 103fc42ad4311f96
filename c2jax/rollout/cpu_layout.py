"""Whether a CPU decode engine keeps the per-layer decode layout (decode_layout_pays), and
how it stores its projection kernels (model.unstack_layers'
projection_layout), by the rows a step multiplies and whether the weights stream from
memory.

XLA:CPU's products with a few rows run far below the memory's bandwidth on some shapes,
and which shape of the same weight runs faster depends on the rows (measured on a 2-core
AMD EPYC VM, 2026-12-01, jax 0.12.0.1; docs/benchmarks.md, "Decode against the JAX
peers"):
  - one row (batch 1): a kernel that contracts more than it produces (`qwen3_small`'s
    down projection, 1,536 -> 512; k and v, 512 -> 256) runs faster transposed, output
    axes first (a chain of such products: 1.2-1.9x); wider ones run slower so (0.8x);
  - 8 or more rows: every projection runs faster transposed, except the LM head, which
    runs faster as 256-column pieces (one product each, which also spreads over the cores);
    the whole `qwen3_small` decode step 1.16-1.26x at batch 8 and 32 (several runs; 1.11x
    at batch 1 with the one-row rule);
  - when the weights fit in the last-level cache (`qwen3_tiny`, 4.6 MB) none of this pays
    (0.55-1.02x), so the kernels stay as model.init stores them.
"""

from __future__ import annotations

import os

import numpy as np

from c2jax.model import TRANSPOSED

# Rows from which every projection is stored transposed (and the LM head in pieces).
ALL_TRANSPOSED_MIN_ROWS = 8
HEAD_PIECE_COLUMNS = 256
# Used when the machine does not say its last-level cache size (that of the VM above).
DEFAULT_LAST_LEVEL_CACHE = 32 << 20
# A MoE layer's routed expert weights up to which a decode engine fuses them
# (fused_experts_pay).
FUSED_EXPERTS_MAX_BYTES = 1 << 20


def last_level_cache_bytes() -> int:
  """The CPU's largest cache (Linux sysfs), else DEFAULT_LAST_LEVEL_CACHE."""
  root = "/sys/devices/system/cpu/cpu0/cache"
  sizes = []
  try:
    for index in os.listdir(root):
      with open(os.path.join(root, index, "size")) as f:
        text = f.read().strip()
      scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
      sizes.append(int(text.rstrip("KMG")) * scale)
  except (OSError, ValueError):
    return DEFAULT_LAST_LEVEL_CACHE
  return max(sizes, default=DEFAULT_LAST_LEVEL_CACHE)


def projection_layout(rows: int, weight_bytes: int, cache_bytes: int | None = None):
  """unstack_layers' projection_layout for decode steps of `rows` tokens over a model
  whose weights take `weight_bytes`, or None (every kernel as it is) when they fit in the
  last-level cache (`cache_bytes`, default last_level_cache_bytes())."""
  if weight_bytes <= (last_level_cache_bytes() if cache_bytes is None else cache_bytes):
    return None

  def layout(name: str, inputs: int, outputs: int):
    if rows < ALL_TRANSPOSED_MIN_ROWS:
      return TRANSPOSED if outputs < inputs else 1
    if name == "lm_head":
      return max(1, outputs // HEAD_PIECE_COLUMNS)
    return TRANSPOSED
  return layout


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
  qwen3_small, tools/bench/bench_decode_layout.py; docs/benchmarks.md, "Decode against the
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
