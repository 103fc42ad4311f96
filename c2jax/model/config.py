"""The model config: one schema for every variant, validated before anything compiles.

Behaviour follows explicit fields, never a model's name:
  attention   'mla' (DeepSeek/Kimi latent attention) | 'gqa' (grouped-query, Qwen3)
  moe.router  'sigmoid_bias' (DeepSeek-V3 scores + selection-only correction bias) | 'softmax'
  moe.expert_parallel  'auto' (all-to-all expert parallelism when the mesh has an expert
              axis) | 'off'; moe.ep_capacity_factor, moe.ep_dispatch_quant 'none' | 'mxfp8',
              moe.ep_exchange 'auto' | 'fixed' | 'ragged'
  moe_impl    'dense' (reference) | 'ragged' (sort by expert + grouped matmul) | 'pallas'
              | 'gathered' (per-copy weight gather; chosen anyway for calls with T*K <= E);
              calls against a KV cache (decoding, prefill) run 'ragged' in place of 'dense'
  grouped_matmul_impl  the expert kernel behind moe_impl 'pallas': 'auto' (the target's
              default, kernels.default_grouped_matmul_impl; docs/kernels.md) or one of
              kernels.grouped_matmul_impls() ('tokamax': the OpenXLA kernel library's)
  quant       'none' | 'mxfp8' | 'nvfp4_fwd_mxfp8_bwd'
  attention_impl  'dense' (float32 [B, H, L, T] scores, the reference) | 'blockwise'
              (flash-style tiles of attention_block queries x keys, O(L) memory; training,
              context-parallel and prefill forwards, one-token decode steps stay dense) |
              'fused' (jax.nn.dot_product_attention: cuDNN on GPU) | 'tokamax' (the OpenXLA
              kernel library's flash attention; opt-in, the `kernels` extra) | 'auto'
              (chosen per call by c2jax.model.fused_attention.select_attention)
  remat       name of a rematerialisation policy (see c2jax.model.transformer.REMAT_POLICIES)

Mixed precision (one policy, three dtypes): `param_dtype` stores the trained parameters
(the master weights), `opt_state_dtype` the optimizer moments, and `dtype` is the compute
dtype every matmul casts its operands to. Real-scale variants train float32 masters and
moments with bfloat16 compute: a bfloat16 master has 8 bits of mantissa, so an update
smaller than ~1/256 of a weight rounds away. Norms, softmax, router scores and the loss
stay in float32 whatever `dtype` says.

Dimension glossary (HF DeepseekV3Config / Qwen3MoeConfig names in brackets):
  hidden_size [hidden_size], intermediate_size: dense FFN width [intermediate_size],
  first_k_dense: leading dense-FFN layers [first_k_dense_replace], moe.intermediate_size:
  routed/shared expert width [moe_intermediate_size], rope.interleave: DeepSeek checkpoints
  store the rope part of q/k interleaved (pairs) [rope_interleave].
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from c2jax import config as configlib

DTYPES = ("float32", "bfloat16")
ROPE_SCALINGS = ("none", "yarn")


def defaults() -> ml_collections.ConfigDict:
  """The full schema with the `tiny` variant's values; variants override fields."""
  c = ml_collections.ConfigDict()
  c.name = "tiny"
  c.vocab_size = 8192
  c.hidden_size = 64
  c.num_layers = 2
  c.first_k_dense = 1
  c.intermediate_size = 192
  c.rms_norm_eps = 1e-6
  c.max_position = 4096
  c.dtype = "float32"
  c.param_dtype = "float32"
  c.opt_state_dtype = "float32"
  c.init_std = 0.02

  c.attention = "mla"
  c.attention_impl = "dense"
  c.attention_block = 512
  c.num_heads = 4
  # GQA fields (ignored by MLA).
  c.num_kv_heads = 2
  c.head_dim = 16
  c.qk_norm = False
  # MLA fields (ignored by GQA). q_lora_rank None: q is one projection (DeepSeek-V2-Lite).
  c.q_lora_rank = config_dict.placeholder(int)
  c.q_lora_rank = 32
  c.kv_lora_rank = 32
  c.qk_nope_head_dim = 16
  c.qk_rope_head_dim = 8
  c.v_head_dim = 16

  c.rope = ml_collections.ConfigDict()
  c.rope.theta = 10000.0
  c.rope.scaling = "none"
  c.rope.factor = 1.0
  c.rope.original_max_position = 4096
  c.rope.beta_fast = 32.0
  c.rope.beta_slow = 1.0
  c.rope.mscale = 1.0
  c.rope.mscale_all_dim = 0.0
  c.rope.interleave = True

  c.moe = ml_collections.ConfigDict()
  c.moe.num_experts = 8
  c.moe.num_experts_per_tok = 2
  c.moe.num_shared_experts = 1
  c.moe.intermediate_size = 32
  c.moe.router = "sigmoid_bias"
  c.moe.n_group = 1
  c.moe.topk_group = 1
  c.moe.norm_topk_prob = True
  c.moe.routed_scaling_factor = 1.0
  c.moe.bias_update_rate = 1e-3
  c.moe.aux_loss_coef = 0.0
  # Router replay plausibility filter (replay_filter.py): a replayed expert scoring below
  # this fraction of the router's own k-th score is replaced; 0 replays as given.
  c.moe.replay_filter_factor = 0.0
  # Expert parallelism (c2jax.parallel.expert): 'auto' runs the experts with all-to-all
  # token dispatch whenever the ambient mesh splits the logical 'expert' axis; 'off' keeps
  # the plain dispatch (XLA then gathers expert weights as it sees fit).
  c.moe.expert_parallel = "auto"
  # Slots per (source, destination) shard pair, as a multiple of the balanced share
  # T_local*K/N; 0 = no drops (T_local*K). Drops are reported as aux['dropped_copies'].
  c.moe.ep_capacity_factor = 0.0
  # Dispatched tokens' wire format: 'none' (model dtype) | 'mxfp8' (E4M3 + E8M0 per 32).
  c.moe.ep_dispatch_quant = "none"
  # Token exchange: 'fixed' capacity buckets | 'ragged' only the copies each shard has for
  # another (dropless: capacity factor 0) | 'auto' ragged where dropless on TPU and GPU.
  c.moe.ep_exchange = "auto"

  c.moe_impl = "dense"
  c.grouped_matmul_impl = "auto"
  c.quant = "none"
  c.num_mtp_layers = 0
  c.remat = "none"
  c.scan_unroll = 1
  return c


def validate(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Raises ConfigError naming the key for anything unknown, mistyped or inconsistent."""
  # Registries live beside the code they select; import here to avoid import cycles.
  import c2jax_kernels as kernels
  from c2jax.model import attention, moe, transformer
  from c2jax.parallel import expert as expert_parallel

  configlib.check_keys(cfg, defaults())
  for key in ("vocab_size", "hidden_size", "num_layers", "intermediate_size", "num_heads",
              "max_position", "rms_norm_eps", "init_std", "rope.theta", "rope.factor",
              "rope.original_max_position", "scan_unroll", "attention_block"):
    configlib.check_positive(cfg, key)
  for key in ("first_k_dense", "num_mtp_layers", "moe.bias_update_rate",
              "moe.aux_loss_coef", "moe.ep_capacity_factor", "moe.replay_filter_factor"):
    configlib.check_positive(cfg, key, allow_zero=True)
  configlib.check_at_most(cfg, "first_k_dense", "num_layers")
  if cfg.moe.replay_filter_factor > 1:
    raise configlib.ConfigError("moe.replay_filter_factor", f"= {cfg.moe.replay_filter_factor}"
                                "; use a value in [0, 1] (0 turns the filter off).")
  configlib.check_choice(cfg, "dtype", DTYPES)
  configlib.check_choice(cfg, "param_dtype", DTYPES)
  configlib.check_choice(cfg, "opt_state_dtype", DTYPES)
  configlib.check_choice(cfg, "attention", attention.ATTENTION)
  configlib.check_choice(cfg, "attention_impl", attention.ATTENTION_IMPLS)
  if cfg.attention_impl == "tokamax" and not kernels.platform.library_installed():
    raise configlib.ConfigError("attention_impl", "is 'tokamax', which needs the tokamax "
                                "package: pip install -e '.[kernels]' (or pick 'auto').")
  configlib.check_choice(cfg, "rope.scaling", ROPE_SCALINGS)
  configlib.check_choice(cfg, "remat", transformer.REMAT_POLICIES)
  configlib.check_choice(cfg, "moe.router", moe.ROUTERS)
  configlib.check_choice(cfg, "moe_impl", moe.DISPATCH)
  configlib.check_choice(cfg, "grouped_matmul_impl",
                         ("auto",) + tuple(kernels.grouped_matmul_impls()))
  configlib.check_choice(cfg, "moe.expert_parallel", expert_parallel.MODES)
  configlib.check_choice(cfg, "moe.ep_dispatch_quant", expert_parallel.DISPATCH_FORMATS)
  configlib.check_choice(cfg, "moe.ep_exchange", expert_parallel.EXCHANGES)
  if cfg.moe.ep_exchange == "ragged" and cfg.moe.ep_capacity_factor != 0:
    raise configlib.ConfigError(
        "moe.ep_exchange", f"= 'ragged' drops nothing, but moe.ep_capacity_factor = "
        f"{cfg.moe.ep_capacity_factor}; set the factor to 0 or the exchange to 'fixed'.")
  configlib.check_choice(cfg, "quant", _quant_recipes())

  if cfg.attention == "gqa":
    configlib.check_positive(cfg, "num_kv_heads")
    configlib.check_positive(cfg, "head_dim")
    configlib.check_divides(cfg, "num_heads", "num_kv_heads")
    if cfg.head_dim % 2:
      raise configlib.ConfigError("head_dim", f"= {cfg.head_dim} must be even for RoPE.")
  else:
    if cfg.q_lora_rank is not None:
      configlib.check_positive(cfg, "q_lora_rank")
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
      configlib.check_positive(cfg, key)
    if cfg.qk_rope_head_dim % 2:
      raise configlib.ConfigError(
          "qk_rope_head_dim", f"= {cfg.qk_rope_head_dim} must be even for RoPE.")

  if cfg.num_layers > cfg.first_k_dense:  # there are MoE layers
    for key in ("moe.num_experts", "moe.num_experts_per_tok", "moe.intermediate_size",
                "moe.n_group", "moe.topk_group", "moe.routed_scaling_factor"):
      configlib.check_positive(cfg, key)
    configlib.check_positive(cfg, "moe.num_shared_experts", allow_zero=True)
    configlib.check_at_most(cfg, "moe.num_experts_per_tok", "moe.num_experts")
    configlib.check_divides(cfg, "moe.num_experts", "moe.n_group")
    configlib.check_at_most(cfg, "moe.topk_group", "moe.n_group")
    experts_in_groups = cfg.moe.topk_group * (cfg.moe.num_experts // cfg.moe.n_group)
    if experts_in_groups < cfg.moe.num_experts_per_tok:
      raise configlib.ConfigError(
          "moe.topk_group",
          f"= {cfg.moe.topk_group} groups of {cfg.moe.num_experts // cfg.moe.n_group} "
          f"experts cannot supply moe.num_experts_per_tok = {cfg.moe.num_experts_per_tok}.")
    if cfg.moe.router == "softmax" and cfg.moe.n_group != 1:
      raise configlib.ConfigError(
          "moe.n_group", "group-limited routing needs moe.router = 'sigmoid_bias'; set 1.")
  if cfg.rope.scaling == "yarn":
    configlib.check_positive(cfg, "rope.beta_fast")
    configlib.check_positive(cfg, "rope.beta_slow")
  return cfg


def _quant_recipes():
  from c2jax import quant  # imported lazily: quant pulls in the kernels package

  return quant.RECIPES
