"""The one table mapping HF tensor names to slices of c2jax parameter leaves, both ways.

Every HF tensor is exactly one slice `leaf[index]` of one c2jax leaf (index = layer, or
layer and expert, within a scanned stack), so conversion streams tensor by tensor. Two
kinds of transform:
  'linear'  HF nn.Linear weight [out, in] <-> Flax kernel [in..., out...]: the slice is
            `hf.T.reshape(slice_shape)`; multi-head kernels split `out` into heads, or
            (o_proj, whose first `in_dims` = 2 axes are inputs) `in` into heads;
  'copy'    same values, same layout (norm scales, embeddings, correction bias).
HF names use the legacy per-expert layout of real checkpoints
(`model.layers.N.mlp.experts.E.gate_proj.weight`, `mlp.gate.e_score_correction_bias`).
The one exception to "one tensor, one slice": DeepSeek-V3's MTP layers repeat the shared
embedding and LM head (`shared_copies`), which convert.py checks and writes separately.
"""

from __future__ import annotations

import dataclasses
import re

import ml_collections
import numpy as np

from c2jax.model import moe
from c2jax.model import mtp

Path = tuple[str, ...]
MTP_KEY = mtp.PARAMS_KEY


@dataclasses.dataclass(frozen=True)
class Piece:
  hf_name: str
  leaf: Path
  index: tuple[int, ...]  # leading indices of the slice within the leaf
  kind: str  # 'linear' | 'copy'
  in_dims: int = 1  # leading slice axes that are the Linear's input (2 for o_proj)

  def to_leaf(self, hf_array: np.ndarray, slice_shape: tuple[int, ...]) -> np.ndarray:
    if self.kind == "linear":
      return hf_array.T.reshape(slice_shape)
    return hf_array.reshape(slice_shape)

  def to_hf(self, leaf_slice: np.ndarray) -> np.ndarray:
    if self.kind == "linear":  # [in..., out...] -> [out, in]
      inputs = int(np.prod(leaf_slice.shape[:self.in_dims], dtype=np.int64))
      return leaf_slice.reshape(inputs, -1).T
    return leaf_slice

  def hf_shape(self, slice_shape: tuple[int, ...]) -> tuple[int, ...]:
    if self.kind == "linear":
      return (int(np.prod(slice_shape[self.in_dims:], dtype=np.int64)),
              int(np.prod(slice_shape[:self.in_dims], dtype=np.int64)))
    return tuple(slice_shape)


def _attention(cfg) -> list[tuple[str, Path, str, tuple[int, ...]]]:
  """(HF name under self_attn., c2jax path under attn/, kind, per-layer shape).

  o_proj's kind 'linear' always has two input axes (heads, head features): see leaves().
  """
  D, H = cfg.hidden_size, cfg.num_heads
  if cfg.attention == "gqa":
    hd, kv = cfg.head_dim, cfg.num_kv_heads
    rows = [("q_proj.weight", ("q_proj", "kernel"), "linear", (D, H, hd)),
            ("k_proj.weight", ("k_proj", "kernel"), "linear", (D, kv, hd)),
            ("v_proj.weight", ("v_proj", "kernel"), "linear", (D, kv, hd)),
            ("o_proj.weight", ("o_proj", "kernel"), "linear", (H, hd, D))]
    if cfg.qk_norm:
      rows += [("q_norm.weight", ("q_norm", "scale"), "copy", (hd,)),
               ("k_norm.weight", ("k_norm", "scale"), "copy", (hd,))]
    return rows
  qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
  if cfg.q_lora_rank is None:
    rows = [("q_proj.weight", ("q_proj", "kernel"), "linear", (D, H, qk))]
  else:
    r = cfg.q_lora_rank
    rows = [("q_a_proj.weight", ("q_a_proj", "kernel"), "linear", (D, r)),
            ("q_a_layernorm.weight", ("q_a_norm", "scale"), "copy", (r,)),
            ("q_b_proj.weight", ("q_b_proj", "kernel"), "linear", (r, H, qk))]
  c = cfg.kv_lora_rank
  return rows + [
      ("kv_a_proj_with_mqa.weight", ("kv_a_proj", "kernel"), "linear",
       (D, c + cfg.qk_rope_head_dim)),
      ("kv_a_layernorm.weight", ("kv_a_norm", "scale"), "copy", (c,)),
      ("kv_b_proj.weight", ("kv_b_proj", "kernel"), "linear",
       (c, H, cfg.qk_nope_head_dim + cfg.v_head_dim)),
      ("o_proj.weight", ("o_proj", "kernel"), "linear", (H, cfg.v_head_dim, D))]


@dataclasses.dataclass(frozen=True)
class Leaf:
  path: Path
  shape: tuple[int, ...]
  pieces: tuple[Piece, ...]

  @property
  def slice_shape(self) -> tuple[int, ...]:
    return self.shape[len(self.pieces[0].index):]


def leaves(cfg: ml_collections.ConfigDict, prefix: str = "") -> list[Leaf]:
  """Every c2jax parameter leaf of `cfg` with the HF tensors that fill it, in HF order.

  MTP depth k (cfg.num_mtp_layers) is HF layer `num_hidden_layers + k`, a decoder layer
  plus enorm / hnorm / eh_proj / shared_head.norm (DeepSeek-V3's layout); its
  `embed_tokens` / `shared_head.head` copies of the shared tensors are in shared_copies().
  """
  D, V = cfg.hidden_size, cfg.vocab_size
  table: dict[Path, tuple[tuple[int, ...], list[Piece]]] = {}

  def add(hf_name: str, path: Path, kind: str, index: tuple[int, ...],
          slice_shape: tuple[int, ...], stack: tuple[int, ...] = ()) -> None:
    shape = stack + slice_shape
    in_dims = 2 if path[-2:] == ("o_proj", "kernel") else 1
    table.setdefault(path, (shape, []))[1].append(
        Piece(prefix + hf_name, path, index, kind, in_dims))

  add("model.embed_tokens.weight", ("embed", "embedding"), "copy", (), (V, D))
  dense_count = cfg.first_k_dense
  moe_count = cfg.num_layers - dense_count
  for layer in range(cfg.num_layers):
    dense = layer < dense_count
    _decoder_layer(add, cfg, f"model.layers.{layer}.",
                   ("dense_layers",) if dense else ("moe_layers",),
                   layer if dense else layer - dense_count,
                   dense_count if dense else moe_count, dense)
  add("model.norm.weight", ("final_norm", "scale"), "copy", (), (D,))
  add("lm_head.weight", ("lm_head", "kernel"), "linear", (), (D, V))
  depths = cfg.num_mtp_layers
  for k in range(depths):
    hf, stack = f"model.layers.{cfg.num_layers + k}.", (depths,)
    add(hf + "enorm.weight", (MTP_KEY, "enorm", "scale"), "copy", (k,), (D,), stack)
    add(hf + "hnorm.weight", (MTP_KEY, "hnorm", "scale"), "copy", (k,), (D,), stack)
    add(hf + "eh_proj.weight", (MTP_KEY, "eh_proj", "kernel"), "linear", (k,), (2 * D, D),
        stack)
    # Dense or MoE exactly as a main layer at that index would be (see mtp.MTPLayer).
    _decoder_layer(add, cfg, hf, (MTP_KEY, "block"), k, depths,
                   cfg.num_layers <= cfg.first_k_dense)
    add(hf + "shared_head.norm.weight", (MTP_KEY, "final_norm", "scale"), "copy", (k,),
        (D,), stack)
  return [Leaf(path, shape, tuple(pieces)) for path, (shape, pieces) in table.items()]


def _decoder_layer(add, cfg, hf: str, stack_path: Path, i: int, count: int,
                   dense: bool) -> None:
  """The HF tensors of one decoder layer: slice i of the stack of `count` at stack_path."""
  D = cfg.hidden_size
  E, Fe, S = cfg.moe.num_experts, cfg.moe.intermediate_size, cfg.moe.num_shared_experts

  def layer_add(name, path, kind, shape, expert=None, experts=()):
    index = (i,) if expert is None else (i, expert)
    add(hf + name, stack_path + path, kind, index, shape, (count,) + experts)

  layer_add("input_layernorm.weight", ("attn_norm", "scale"), "copy", (D,))
  for name, path, kind, shape in _attention(cfg):
    layer_add("self_attn." + name, ("attn",) + path, kind, shape)
  layer_add("post_attention_layernorm.weight", ("mlp_norm", "scale"), "copy", (D,))
  if dense:
    F = cfg.intermediate_size
    for proj, shape in (("gate_proj", (D, F)), ("up_proj", (D, F)), ("down_proj", (F, D))):
      layer_add(f"mlp.{proj}.weight", ("mlp", proj, "kernel"), "linear", shape)
    return
  layer_add("mlp.gate.weight", ("moe", "router", "kernel"), "linear", (D, E))
  if cfg.moe.router == "sigmoid_bias":
    layer_add("mlp.gate.e_score_correction_bias", ("moe", "router", "correction_bias"),
              "copy", (E,))
  for e in range(E):
    for proj, shape in zip(moe.EXPERT_WEIGHTS, ((D, Fe), (D, Fe), (Fe, D))):
      layer_add(f"mlp.experts.{e}.{proj}.weight", ("moe", "experts", proj), "linear", shape,
                expert=e, experts=(E,))
  if S:
    for proj, shape in (("gate_proj", (D, S * Fe)), ("up_proj", (D, S * Fe)),
                        ("down_proj", (S * Fe, D))):
      layer_add(f"mlp.shared_experts.{proj}.weight", ("moe", "shared", proj, "kernel"),
                "linear", shape)


def shared_copies(cfg: ml_collections.ConfigDict, prefix: str = "") -> dict[str, str]:
  """HF name of each MTP depth's copy of a shared tensor -> the main tensor it copies.

  DeepSeek-V3 checkpoints store the embedding and LM head again inside every MTP layer;
  c2jax shares one of each, so loading checks the copies and saving writes them.
  """
  out = {}
  for k in range(cfg.num_mtp_layers):
    hf = f"{prefix}model.layers.{cfg.num_layers + k}."
    out[hf + "embed_tokens.weight"] = prefix + "model.embed_tokens.weight"
    out[hf + "shared_head.head.weight"] = prefix + "lm_head.weight"
  return out


_MTP_OR_EXTRA_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_QUANT_SUFFIXES = ("weight_scale_inv", "weight_scale", "weight_packed", "weight_shape",
                   "weight_zero_point")


def skipped_reason(hf_name: str, cfg, prefix: str) -> str | None:
  """Why an HF tensor outside the mapping may be ignored; None if it must not be."""
  if prefix and not hf_name.startswith(prefix):
    return "not part of the text model (vision tower / projector)"
  match = _MTP_OR_EXTRA_LAYER.match(hf_name.removeprefix(prefix))
  if match and int(match.group(1)) >= cfg.num_layers + cfg.num_mtp_layers:
    return ("multi-token-prediction layer beyond config.json's num_nextn_predict_layers "
            f"= {cfg.num_mtp_layers}")
  return None


def unmapped_error(hf_name: str) -> str:
  if hf_name.endswith(_QUANT_SUFFIXES):
    return (f"tensor {hf_name!r} belongs to a quantized checkpoint (fp8 block scales / int4 "
            "packing) but config.json declares no quantization_config; restore the "
            "checkpoint's own config.json (c2jax can dequantize the formats it declares).")
  return (f"tensor {hf_name!r} has no place in the c2jax model built from this config.json; "
          "the checkpoint and its config disagree (or the architecture is unsupported).")
