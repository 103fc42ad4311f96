"""HF config.json <-> c2jax model config translation, on the public real-model configs."""

from __future__ import annotations

import json

import pytest

from c2jax import hf
from c2jax.model import variants
from tests.hf.conftest import CASES, FIXTURES

# Public config.json contents of the real models (bf16 weights; trimmed of fields c2jax
# ignores). DeepSeek-V3 in its original (transformers 4.x) format with rope_scaling.
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "attention_bias": False, "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
    "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280}

KIMI_K25 = {
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
    "vision_config": {"patch_size": 14}, "text_config": dict(
        DEEPSEEK_V3, model_type="kimi_k2", first_k_dense_replace=1, n_group=1, topk_group=1,
        n_routed_experts=384, num_attention_heads=64, num_key_value_heads=64,
        num_nextn_predict_layers=0, max_position_embeddings=262144, vocab_size=163840,
        routed_scaling_factor=2.827, rope_theta=50000.0,
        rope_scaling={"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0,
                      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                      "type": "yarn"})}

QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "attention_bias": False, "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "mlp_only_layers": [], "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False,
    "vocab_size": 151936}

# Qwen3-8B, the dense family (Qwen3ForCausalLM; its small siblings tie the embeddings,
# which c2jax's untied LM head does not represent).
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}

# Fields that are training choices, not architecture: the variant table sets them freely.
# The master-weight and optimizer-state dtypes are the training precision policy (float32
# masters for the real-scale variants), not the checkpoint's storage dtype.
_NOT_ARCHITECTURE = ("name", "remat", "num_mtp_layers", "param_dtype", "opt_state_dtype")


def _flat(cfg) -> dict:
  out = {}
  for key, value in cfg.items():
    if hasattr(value, "items"):
      out.update({f"{key}.{k}": v for k, v in _flat(value).items()})
    elif key not in _NOT_ARCHITECTURE:
      out[key] = value
  return out


@pytest.mark.parametrize("hf_config,variant,prefix", [
    (DEEPSEEK_V3, "deepseek_v3", ""), (KIMI_K25, "kimi_k25", "language_model."),
    (QWEN3_30B_A3B, "qwen3_moe_30b_a3b", "")])
def test_real_configs_translate_to_the_variant_table(hf_config, variant, prefix):
  cfg, layout = hf.from_hf(hf_config)
  assert layout.prefix == prefix
  assert _flat(cfg) == _flat(variants.get(variant))


def test_qwen3_dense_is_gqa_with_qk_norm_and_no_moe_layers():
  cfg, layout = hf.from_hf(QWEN3_8B)
  assert layout.model_type == "qwen3" and cfg.name == "qwen3"
  assert (cfg.attention, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == ("gqa", 32, 8, 128)
  assert cfg.qk_norm and not cfg.rope.interleave and cfg.rope.theta == 1e6
  assert cfg.first_k_dense == cfg.num_layers == 36 and cfg.intermediate_size == 12288
  back = hf.to_hf(cfg, base=QWEN3_8B)
  assert back["architectures"] == ["Qwen3ForCausalLM"] and back["model_type"] == "qwen3"
  assert not {"num_experts", "moe_intermediate_size", "mlp_only_layers"} & set(back)
  # A Qwen3-MoE base written back as a dense model drops its MoE fields.
  dense_from_moe = hf.to_hf(cfg, base=QWEN3_30B_A3B)
  assert dense_from_moe["model_type"] == "qwen3" and "num_experts" not in dense_from_moe


@pytest.mark.parametrize("change,field", [
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"num_key_value_heads": None}, "num_key_value_heads")])
def test_qwen3_dense_unsupported_fields_are_named(change, field):
  with pytest.raises(hf.HFConfigError, match=field):
    hf.from_hf(dict(QWEN3_8B, **change))


@pytest.mark.parametrize("hf_config", [DEEPSEEK_V3, KIMI_K25, QWEN3_30B_A3B, QWEN3_8B])
def test_to_hf_then_from_hf_is_identity(hf_config):
  cfg, _ = hf.from_hf(hf_config)
  back = hf.to_hf(cfg, base=hf_config)
  assert "text_config" not in back and "rope_scaling" not in back
  assert _flat(hf.from_hf(back)[0]) == _flat(cfg)  # name: the output model_type
  assert back["bos_token_id" if "bos_token_id" in hf_config else "vocab_size"] is not None


@pytest.mark.parametrize("case", CASES)
def test_fixture_configs_written_by_transformers_v5_translate(case):
  hf_config = json.loads((FIXTURES / case / "config.json").read_text())
  cfg, _ = hf.from_hf(hf_config)
  text = hf_config.get("text_config", hf_config)
  back = hf.to_hf(cfg, base=hf_config)
  for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "norm_topk_prob", "vocab_size"):
    assert back.get(key) == text.get(key), key  # dense Qwen3 has no norm_topk_prob
  for key, value in text["rope_parameters"].items():  # back may add explicit defaults
    assert back["rope_parameters"][key] == value, key


def test_missing_mscale_means_unset_as_in_hf():
  rope = dict(DEEPSEEK_V3["rope_scaling"], mscale=None)
  del rope["mscale_all_dim"]
  cfg, _ = hf.from_hf(dict(DEEPSEEK_V3, rope_scaling=rope))
  assert cfg.rope.mscale == 0.0 and cfg.rope.mscale_all_dim == 0.0  # HF: falsy -> unset


@pytest.mark.parametrize("change,field", [
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_parameters.rope_type"),
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"model_type": "llama"}, "model_type"),
    ({"torch_dtype": "float16"}, "dtype"),
])
def test_unsupported_fields_are_named(change, field):
  with pytest.raises(hf.HFConfigError, match=field.replace(".", r"\.")):
    hf.from_hf(dict(DEEPSEEK_V3, **change))


def test_qwen_dense_layers_must_lead():
  cfg, _ = hf.from_hf(dict(QWEN3_30B_A3B, mlp_only_layers=[0, 1]))
  assert cfg.first_k_dense == 2
  with pytest.raises(hf.HFConfigError, match="mlp_only_layers"):
    hf.from_hf(dict(QWEN3_30B_A3B, mlp_only_layers=[3]))


def test_inconsistent_dimensions_fail_in_c2jax_validation():
  with pytest.raises(ValueError, match="moe.num_experts_per_tok"):
    hf.from_hf(dict(DEEPSEEK_V3, num_experts_per_tok=300))


def test_architectures_hf_cannot_express_are_refused():
  cfg, _ = hf.from_hf(QWEN3_30B_A3B)
  cfg.moe.num_shared_experts = 1
  with pytest.raises(ValueError, match="no HF architecture"):
    hf.to_hf(cfg)


def test_missing_fields_take_transformers_class_defaults():
  trimmed = {k: v for k, v in DEEPSEEK_V3.items()
             if k not in ("routed_scaling_factor", "n_group", "topk_group", "q_lora_rank")}
  cfg, _ = hf.from_hf(trimmed)  # DeepseekV3Config defaults: 2.5, 8, 4, 1536
  assert (cfg.moe.routed_scaling_factor, cfg.moe.n_group, cfg.moe.topk_group,
          cfg.q_lora_rank, cfg.rope.interleave) == (2.5, 8, 4, 1536, True)
  cfg, _ = hf.from_hf(dict(DEEPSEEK_V3, q_lora_rank=None))  # explicit null: no q LoRA
  assert cfg.q_lora_rank is None
  qwen = {k: v for k, v in QWEN3_30B_A3B.items() if k != "norm_topk_prob"}
  assert hf.from_hf(qwen)[0].moe.norm_topk_prob is False  # Qwen3MoeConfig default
