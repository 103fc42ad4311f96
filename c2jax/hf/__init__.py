"""c2jax.hf: HuggingFace checkpoint interop for DeepseekV3, Kimi-K2/K2.5 (text) and Qwen3-MoE.

    from c2jax import hf, model
    cfg, params = hf.load("path/to/hf_dir")        # validated config + numpy params
    logits = model.forward(cfg, params, tokens)     # float32 [B, L, V]
    hf.save(cfg, params, "out_dir")                 # config.json + shards + index

Streaming (bounded memory, for checkpoints larger than RAM), also as `c2jax convert`:
    hf.convert_from_hf("hf_dir", "ckpt")            # -> c2jax CKPT (see checkpoint.py)
    hf.convert_to_hf("ckpt", "hf_dir")
    cfg, params = hf.load_checkpoint("ckpt")

Any phase's `init_from` takes an HF directory (or convert output) directly, streamed shard
by shard into the run's mesh (sources.py: detection and reading, placement.py: placing);
`c2jax export` (export.py) writes any phase's run back as an HF directory.

On disk HF tensors use the legacy per-expert names of real checkpoints. DeepSeek-V3's
multi-token-prediction layers (`num_nextn_predict_layers`) load into params['mtp_layers']
and are saved back in the same layout; Kimi-K2.5's vision tower is skipped. Released
quantised checkpoints (DeepSeek FP8 blocks, Kimi INT4 pack-quantized) are dequantised
on load (for an inference engine, `load(..., weights_quant=)` keeps the routed experts as
stored) and can be written again with `save(..., quantize=)` (see quantized.py).
"""

from c2jax.hf.checkpoint import load_checkpoint
from c2jax.hf.config import HFConfigError, Layout, from_hf, to_hf
from c2jax.hf.convert import convert_from_hf, convert_to_hf, load, save

__all__ = ["HFConfigError", "Layout", "convert_from_hf", "convert_to_hf", "from_hf",
           "load", "load_checkpoint", "save", "to_hf"]
