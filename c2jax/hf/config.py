"""HF `config.json` <-> c2jax model config, for DeepseekV3, Kimi-K2/K2.5, Qwen3-MoE and
Qwen3 (dense).

`from_hf(hf)` returns `(cfg, layout)`: the validated c2jax model config and where the text
model's tensors live in the checkpoint (Kimi-K2.5 nests a DeepseekV3 text model under
`text_config` / `language_model.`). `to_hf(cfg, base)` writes the text backbone as its own
HF architecture (deepseek_v3 for MLA + sigmoid router, qwen3_moe for GQA + softmax, qwen3
for GQA without MoE layers), on
top of `base` (the source checkpoint's config) so fields c2jax does not model (token ids,
...) survive a round trip. Anything c2jax cannot represent exactly is an error naming the
HF field: silently dropping it would break parity.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_collections

from c2jax import config as configlib
from c2jax.model import config as model_config

DEEPSEEK_TYPES = ("deepseek_v3", "kimi_k2")
WRAPPER_TYPES = ("kimi_k25",)
QWEN_TYPES = ("qwen3_moe", "qwen3")
_DTYPES = {"bfloat16": "bfloat16", "float32": "float32"}
# transformers' class defaults for fields a config.json may omit: HF fills a missing key
# from its config class, so c2jax must too (an explicit null stays null).
_DEEPSEEK_DEFAULTS = dict(
    q_lora_rank=1536, first_k_dense_replace=3, n_routed_experts=256, num_experts_per_tok=8,
    n_shared_experts=1, moe_intermediate_size=2048, n_group=8, topk_group=4,
    norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True)
_QWEN3_MOE_DEFAULTS = dict(
    num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
    norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[])


class HFConfigError(ValueError):
  """An HF config.json field that c2jax cannot load or represent."""

  def __init__(self, field: str, message: str):
    self.field = field
    super().__init__(f"HF config.json field {field!r}: {message}")


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where the text model sits in an HF checkpoint."""
  model_type: str  # the text model's HF model_type
  prefix: str = ""  # prepended to every text tensor name, e.g. 'language_model.'


def _require(hf: dict, field: str) -> Any:
  if hf.get(field) is None:
    raise HFConfigError(field, "is missing; c2jax needs it to build the model.")
  return hf[field]


def _expect(hf: dict, field: str, allowed: tuple, why: str) -> None:
  if field in hf and hf[field] not in allowed:
    raise HFConfigError(field, f"= {hf[field]!r} is not supported ({why}).")


def _rope_from_hf(hf: dict) -> dict:
  params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  if any(isinstance(v, dict) for v in params.values()):
    raise HFConfigError("rope_parameters", "per-layer-type RoPE is not supported.")
  theta = params.get("rope_theta", hf.get("rope_theta"))
  if theta is None:
    raise HFConfigError("rope_theta", "is missing (neither top level nor rope_parameters).")
  kind = params.get("rope_type", params.get("type", "default"))
  rope = dict(theta=float(theta), scaling="none")
  if kind == "default":
    return rope
  if kind != "yarn":
    raise HFConfigError("rope_parameters.rope_type", f"= {kind!r}; only default and yarn.")
  if params.get("attention_factor") is not None:
    raise HFConfigError("rope_parameters.attention_factor",
                        "an explicit YaRN attention factor is not supported; remove it.")
  if params.get("truncate", True) is not True:
    raise HFConfigError("rope_parameters.truncate", "only the truncated YaRN range is "
                        "supported.")
  original = params.get("original_max_position_embeddings") or _require(
      hf, "max_position_embeddings")
  factor = params.get("factor") or _require(hf, "max_position_embeddings") / original
  # HF treats a missing (None) beta/mscale like its default (beta) or as "unset"
  # (mscale: falsy), which c2jax's rope reproduces with these values.
  rope.update(scaling="yarn", factor=float(factor), original_max_position=int(original),
              beta_fast=float(params.get("beta_fast") or 32.0),
              beta_slow=float(params.get("beta_slow") or 1.0),
              mscale=float(params.get("mscale") or 0.0),
              mscale_all_dim=float(params.get("mscale_all_dim") or 0.0))
  return rope


def _rope_to_hf(rope) -> dict:
  if rope.scaling == "none":
    return {"rope_type": "default", "rope_theta": rope.theta}
  out = {"rope_type": "yarn", "rope_theta": rope.theta, "factor": rope.factor,
         "original_max_position_embeddings": rope.original_max_position,
         "beta_fast": rope.beta_fast, "beta_slow": rope.beta_slow}
  # 0.0 is c2jax's "unset", which HF spells by leaving the key out.
  out.update({k: rope[k] for k in ("mscale", "mscale_all_dim") if rope[k]})
  return out


def _dtype(hf: dict) -> str:
  name = hf.get("dtype") or hf.get("torch_dtype") or "float32"
  if hf.get("quantization_config"):
    raise HFConfigError("quantization_config", "is still set: read quantized checkpoints "
                        "through c2jax.hf.sources.open_tensors (init_from, hf.load and "
                        "convert do), which dequantizes them and drops it.")
  if name not in _DTYPES:
    raise HFConfigError("dtype", f"= {name!r}; c2jax loads {sorted(_DTYPES)} checkpoints.")
  return _DTYPES[name]


def _common(hf: dict) -> dict:
  _expect(hf, "hidden_act", ("silu",), "c2jax's MLPs are SwiGLU")
  _expect(hf, "attention_bias", (False,), "c2jax projections have no bias")
  _expect(hf, "tie_word_embeddings", (False,), "c2jax's LM head is untied")
  dtype = _dtype(hf)
  return dict(
      vocab_size=_require(hf, "vocab_size"), hidden_size=_require(hf, "hidden_size"),
      num_layers=_require(hf, "num_hidden_layers"),
      intermediate_size=_require(hf, "intermediate_size"),
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      max_position=_require(hf, "max_position_embeddings"), dtype=dtype, param_dtype=dtype,
      init_std=float(hf.get("initializer_range", 0.02)),
      num_heads=_require(hf, "num_attention_heads"), num_mtp_layers=0)


def _deepseek(hf: dict) -> dict:
  hf = {**_DEEPSEEK_DEFAULTS, **hf}
  _expect(hf, "scoring_func", ("sigmoid",), "the DeepseekV3 router is sigmoid + bias")
  _expect(hf, "topk_method", ("noaux_tc",), "the DeepseekV3 router is noaux_tc")
  _expect(hf, "moe_layer_freq", (1,), "every layer after the first-k dense is MoE")
  fields = _common(hf)
  num_layers = fields["num_layers"]
  rope = _rope_from_hf(hf)
  rope["interleave"] = bool(hf["rope_interleave"])
  experts = hf.get("num_local_experts", hf["n_routed_experts"])
  fields.update(
      attention="mla", q_lora_rank=hf.get("q_lora_rank"),
      # DeepSeek-V3's MTP layers are stored as extra decoder layers past the main ones.
      num_mtp_layers=int(hf.get("num_nextn_predict_layers") or 0),
      kv_lora_rank=_require(hf, "kv_lora_rank"),
      qk_nope_head_dim=_require(hf, "qk_nope_head_dim"),
      qk_rope_head_dim=_require(hf, "qk_rope_head_dim"),
      v_head_dim=_require(hf, "v_head_dim"),
      # HF builds MoE for layer_idx >= first_k_dense_replace.
      first_k_dense=min(int(hf["first_k_dense_replace"] or 0), num_layers), rope=rope,
      moe=dict(num_experts=experts, num_experts_per_tok=hf["num_experts_per_tok"],
               num_shared_experts=int(hf["n_shared_experts"] or 0),
               intermediate_size=hf["moe_intermediate_size"], router="sigmoid_bias",
               n_group=int(hf["n_group"] or 1), topk_group=int(hf["topk_group"] or 1),
               norm_topk_prob=bool(hf["norm_topk_prob"]),
               routed_scaling_factor=float(hf["routed_scaling_factor"])))
  return fields


def _qwen3_moe(hf: dict) -> dict:
  hf = {**_QWEN3_MOE_DEFAULTS, **hf}
  _expect(hf, "use_sliding_window", (False,), "no sliding-window attention in c2jax")
  _expect(hf, "decoder_sparse_step", (1,), "every layer after the dense ones is MoE")
  fields = _common(hf)
  num_layers = fields["num_layers"]
  dense = sorted(hf.get("mlp_only_layers") or [])
  if dense != list(range(len(dense))):
    raise HFConfigError("mlp_only_layers", f"= {dense}; c2jax supports only leading dense "
                        "layers [0, ..., k-1].")
  rope = _rope_from_hf(hf)
  rope["interleave"] = False  # HF Qwen3 rotates halves (rotate_half)
  fields.update(
      attention="gqa", num_kv_heads=_require(hf, "num_key_value_heads"),
      head_dim=hf.get("head_dim") or fields["hidden_size"] // fields["num_heads"],
      qk_norm=True, first_k_dense=min(len(dense), num_layers), rope=rope,
      moe=dict(num_experts=hf.get("num_local_experts", hf["num_experts"]),
               num_experts_per_tok=hf["num_experts_per_tok"], num_shared_experts=0,
               intermediate_size=hf["moe_intermediate_size"], router="softmax",
               n_group=1, topk_group=1, norm_topk_prob=bool(hf["norm_topk_prob"]),
               routed_scaling_factor=1.0))
  return fields


def _qwen3_dense(hf: dict) -> dict:
  """Qwen3 (`Qwen3ForCausalLM`): GQA with q/k norm and a dense SwiGLU MLP in every layer,
  i.e. c2jax's GQA model with first_k_dense = num_layers (its moe fields then unused)."""
  _expect(hf, "use_sliding_window", (False,), "no sliding-window attention in c2jax")
  fields = _common(hf)
  rope = _rope_from_hf(hf)
  rope["interleave"] = False  # HF Qwen3 rotates halves (rotate_half)
  fields.update(
      attention="gqa", num_kv_heads=_require(hf, "num_key_value_heads"),
      head_dim=hf.get("head_dim") or fields["hidden_size"] // fields["num_heads"],
      qk_norm=True, first_k_dense=fields["num_layers"], rope=rope)
  return fields


_FROM_HF = {"qwen3_moe": _qwen3_moe, "qwen3": _qwen3_dense}


def text_config(hf: dict) -> tuple[dict, Layout]:
  """The text model's HF config and its layout, unwrapping Kimi-K2.5."""
  model_type = hf.get("model_type")
  if model_type in WRAPPER_TYPES:
    inner = dict(_require(hf, "text_config"))
    inner.setdefault("dtype", hf.get("dtype") or hf.get("torch_dtype"))
    inner_type = inner.get("model_type", "deepseek_v3")
    if inner_type not in DEEPSEEK_TYPES:
      raise HFConfigError("text_config.model_type", f"= {inner_type!r}; expected one of "
                          f"{DEEPSEEK_TYPES}.")
    return inner, Layout(inner_type, prefix="language_model.")
  if model_type in DEEPSEEK_TYPES + QWEN_TYPES:
    return hf, Layout(model_type)
  raise HFConfigError("model_type", f"= {model_type!r}; c2jax converts "
                      f"{sorted(DEEPSEEK_TYPES + WRAPPER_TYPES + QWEN_TYPES)}.")


def from_hf(hf: dict) -> tuple[ml_collections.ConfigDict, Layout]:
  """(validated c2jax model config, layout) for an HF config.json dict."""
  text, layout = text_config(hf)
  fields = _FROM_HF.get(layout.model_type, _deepseek)(text)
  cfg = model_config.defaults()
  cfg.name = layout.model_type
  configlib.apply_overrides(cfg, fields)
  return model_config.validate(cfg), layout


def config_from_dict(values: dict) -> ml_collections.ConfigDict:
  """A validated c2jax model config from its `to_dict()` form (e.g. read from JSON)."""
  cfg = model_config.defaults()
  configlib.apply_overrides(cfg, values)
  return model_config.validate(cfg)


def to_hf(cfg: ml_collections.ConfigDict, base: dict | None = None) -> dict:
  """The HF config.json of cfg's text model; `base` supplies fields c2jax does not model."""
  common = dict(
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
      intermediate_size=cfg.intermediate_size,
      num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
      max_position_embeddings=cfg.max_position, rms_norm_eps=cfg.rms_norm_eps,
      initializer_range=cfg.init_std, rope_parameters=_rope_to_hf(cfg.rope),
      hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
      dtype=cfg.param_dtype)
  moe_fields = dict(moe_intermediate_size=cfg.moe.intermediate_size,
                    num_experts_per_tok=cfg.moe.num_experts_per_tok,
                    norm_topk_prob=cfg.moe.norm_topk_prob)
  qwen3_attention = (cfg.attention == "gqa" and cfg.qk_norm and cfg.num_mtp_layers == 0
                     and not cfg.rope.interleave)
  if qwen3_attention and cfg.first_k_dense == cfg.num_layers:
    arch = dict(
        model_type="qwen3", architectures=["Qwen3ForCausalLM"],
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        use_sliding_window=False)
  elif cfg.attention == "mla" and cfg.moe.router == "sigmoid_bias":
    arch = dict(
        model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"],
        num_key_value_heads=cfg.num_heads, q_lora_rank=cfg.q_lora_rank,
        kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
        qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
        first_k_dense_replace=cfg.first_k_dense, n_routed_experts=cfg.moe.num_experts,
        **moe_fields,
        n_shared_experts=cfg.moe.num_shared_experts, n_group=cfg.moe.n_group,
        topk_group=cfg.moe.topk_group, routed_scaling_factor=cfg.moe.routed_scaling_factor,
        rope_interleave=cfg.rope.interleave, num_nextn_predict_layers=cfg.num_mtp_layers)
  elif (qwen3_attention and cfg.moe.router == "softmax"
        and cfg.moe.num_shared_experts == 0
        and math.isclose(cfg.moe.routed_scaling_factor, 1.0)):
    arch = dict(**moe_fields,
        model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        num_experts=cfg.moe.num_experts, decoder_sparse_step=1,
        mlp_only_layers=list(range(cfg.first_k_dense)), use_sliding_window=False)
  else:
    raise configlib.ConfigError(
        "attention", "no HF architecture matches this model: HF has MLA + 'sigmoid_bias' "
        "(deepseek_v3, with or without MTP layers) and GQA + qk_norm without MTP layers "
        "(num_mtp_layers = 0) or interleaved rope, either all dense (first_k_dense = "
        "num_layers: qwen3) or with a 'softmax' router and no shared experts or scaling "
        "(qwen3_moe).")
  out = dict(text_config(base)[0]) if base else {}
  if arch["model_type"] == "qwen3":  # a dense model: no MoE fields from a MoE base
    for moe_key in ("moe_intermediate_size", "num_experts_per_tok", "norm_topk_prob",
                    "num_experts", "decoder_sparse_step", "mlp_only_layers"):
      out.pop(moe_key, None)
  for stale in ("rope_scaling", "rope_theta", "num_local_experts", "torch_dtype",
                "quantization_config", "text_config", "vision_config", "auto_map"):
    out.pop(stale, None)
  out.update(common)
  out.update(arch)
  return out
