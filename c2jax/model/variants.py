"""Model size variants in one table: each is a set of overrides of `config.defaults()`.

Real-model values follow the public HF configs (DeepSeek-V3, Kimi-K2/K2.5 text backbone,
Qwen3-30B-A3B); `tiny` and `small` are c2jax's CPU sizes.
"""

from __future__ import annotations

import ml_collections

from c2jax import config as configlib
from c2jax.model import config as model_config

_DEEPSEEK_V3_ATTENTION = dict(
    attention="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
    qk_rope_head_dim=64, v_head_dim=128)

# Real-scale training: float32 master weights and Adam moments, bfloat16 matmuls
# (c2jax/model/config.py, "Mixed precision"). CPU sizes compute in float32 too.
_FP32_MASTERS_BF16_COMPUTE = dict(dtype="bfloat16", param_dtype="float32",
                                  opt_state_dtype="float32")

VARIANTS: dict[str, dict] = {
    # CPU tests (~1.2M params): MLA + one dense and one MoE layer with a shared expert.
    "tiny": dict(),
    # CPU-trainable demo (~70M params total).
    "small": dict(
        vocab_size=16384, hidden_size=512, num_layers=8, first_k_dense=1,
        intermediate_size=1536, num_heads=8, q_lora_rank=192, kv_lora_rank=128,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, max_position=32768,
        moe=dict(num_experts=16, num_experts_per_tok=2, num_shared_experts=1,
                 intermediate_size=256, n_group=1, topk_group=1,
                 routed_scaling_factor=1.0)),
    # Dense Qwen3 (HF Qwen3ForCausalLM: GQA + q/k norm, a dense MLP in every layer) at
    # the CPU sizes: `qwen3_tiny` for tests (~1.1M), `qwen3_small` (~42M) for CPU
    # benchmarks (small's width, depth and vocabulary; 8 query over 4 KV heads of 64).
    "qwen3_tiny": dict(
        attention="gqa", num_kv_heads=2, head_dim=16, qk_norm=True, first_k_dense=2,
        rope=dict(theta=1000000.0, interleave=False)),
    "qwen3_small": dict(
        vocab_size=16384, hidden_size=512, num_layers=8, first_k_dense=8,
        intermediate_size=1536, num_heads=8, attention="gqa", num_kv_heads=4, head_dim=64,
        qk_norm=True, max_position=32768, rope=dict(theta=1000000.0, interleave=False)),
    # A ~1B-active MoE for single-node GPU benchmarks (train-step MFU, rooflines):
    # DeepSeek-V3 shape at 2/7 width: 8.1B total / 1.1B active parameters.
    "moe_8b_a1b": dict(
        vocab_size=32768, hidden_size=2048, num_layers=20, first_k_dense=1,
        intermediate_size=8192, num_heads=16, q_lora_rank=512, kv_lora_rank=256,
        qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, max_position=32768,
        dtype="bfloat16", param_dtype="bfloat16", remat="full",
        moe=dict(num_experts=64, num_experts_per_tok=6, num_shared_experts=1,
                 intermediate_size=1024, router="sigmoid_bias", n_group=1, topk_group=1,
                 norm_topk_prob=True, routed_scaling_factor=2.5)),
    "deepseek_v3": dict(
        vocab_size=129280, hidden_size=7168, num_layers=61, first_k_dense=3,
        intermediate_size=18432, num_heads=128, max_position=163840,
        **_FP32_MASTERS_BF16_COMPUTE, num_mtp_layers=1, remat="full",
        rope=dict(theta=10000.0, scaling="yarn", factor=40.0, original_max_position=4096,
                  beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                  interleave=True),
        moe=dict(num_experts=256, num_experts_per_tok=8, num_shared_experts=1,
                 intermediate_size=2048, router="sigmoid_bias", n_group=8, topk_group=4,
                 norm_topk_prob=True, routed_scaling_factor=2.5),
        **_DEEPSEEK_V3_ATTENTION),
    # Kimi K2.5 text backbone: DeepSeek-V3 architecture, 384 experts, 64 heads, 256K
    # context (YaRN factor 64 over the original 4096 positions).
    "kimi_k25": dict(
        vocab_size=163840, hidden_size=7168, num_layers=61, first_k_dense=1,
        intermediate_size=18432, num_heads=64, max_position=262144,
        **_FP32_MASTERS_BF16_COMPUTE, remat="full",
        rope=dict(theta=50000.0, scaling="yarn", factor=64.0, original_max_position=4096,
                  beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                  interleave=True),
        moe=dict(num_experts=384, num_experts_per_tok=8, num_shared_experts=1,
                 intermediate_size=2048, router="sigmoid_bias", n_group=1, topk_group=1,
                 norm_topk_prob=True, routed_scaling_factor=2.827),
        **_DEEPSEEK_V3_ATTENTION),
    # The report's scaling-study family: GQA with q/k norm, softmax top-8 of 128 experts.
    "qwen3_moe_30b_a3b": dict(
        vocab_size=151936, hidden_size=2048, num_layers=48, first_k_dense=0,
        intermediate_size=6144, num_heads=32, attention="gqa", num_kv_heads=4,
        head_dim=128, qk_norm=True, max_position=40960, **_FP32_MASTERS_BF16_COMPUTE,
        remat="full",
        rope=dict(theta=1000000.0, scaling="none", interleave=False),
        moe=dict(num_experts=128, num_experts_per_tok=8, num_shared_experts=0,
                 intermediate_size=768, router="softmax", n_group=1, topk_group=1,
                 norm_topk_prob=True, routed_scaling_factor=1.0)),
}


def get(name: str, **overrides) -> ml_collections.ConfigDict:
  """The validated model config of a variant, with optional top-level overrides."""
  if name not in VARIANTS:
    raise ValueError(
        f"Unknown model variant {name!r}; choose one of {sorted(VARIANTS)} "
        "(defined in c2jax/model/variants.py).")
  cfg = model_config.defaults()
  cfg.name = name
  configlib.apply_overrides(cfg, VARIANTS[name])
  configlib.apply_overrides(cfg, overrides)
  return cfg

