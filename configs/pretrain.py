"""Phase 1 of continued pretraining: short context on the code corpus.

  c2jax pretrain --config=configs/pretrain.py:tiny --workdir=runs/tiny/pretrain
  c2jax pretrain --config=configs/pretrain.py:small --workdir=runs/small/pretrain
Real-scale variants (deepseek_v3, kimi_k25, qwen3_moe_30b_a3b) use 32k-token sequences,
256 of them per step, on the mesh fsdp=-1, expert=8, context=2 (the report's EP=8, CP=2);
`c2jax plan --memory --config=configs/pretrain.py:kimi_k25` compiles that step on a
simulated mesh and reports its per-device memory (docs/scaling.md).
"""

from c2jax.train import jobs

TEST_ARGS = ("tiny", "small", "kimi_k25")

# Per-variant run sizes: CPU sizes build a small corpus from this machine's Python sources.
RUNS = {
    "tiny": dict(steps=200, batch_size=8, seq_len=128, learning_rate=3e-3, warmup_steps=20,
                 eval_every=50, checkpoint_every=50, data_bytes=6 * 2**20),
    # Sized to finish in under ~10 minutes on a 2-core CPU (docs/benchmarks.md).
    "small": dict(steps=40, batch_size=4, seq_len=256, learning_rate=1e-3, warmup_steps=4,
                  eval_every=8, eval_batches=4, checkpoint_every=20,
                  data_bytes=24 * 2**20),
}
REAL_SCALE = dict(steps=100_000, batch_size=256, seq_len=32768, learning_rate=2e-4,
                  warmup_steps=2000, eval_every=1000, checkpoint_every=500,
                  data_bytes=None)


def get_config(variant: str = "tiny"):
  variant = variant or "tiny"
  c = jobs.job_defaults(variant)
  run = dict(RUNS.get(variant, REAL_SCALE))
  data_bytes = run.pop("data_bytes")
  for key, value in run.items():
    c.train[key] = value
  if data_bytes is not None:
    c.data.max_total_bytes = data_bytes
    c.data.tokenizer_train_bytes = min(data_bytes, 4 * 2**20)
  else:
    c.train.schedule = "wsd"
    # The grouped-matmul kernel: the dense reference would run all experts on all tokens.
    c.model.moe_impl = "pallas"
    # The memory plan (docs/scaling.md): the no-drop expert-parallel buffers are 8x the
    # balanced ones; MXFP8 tokens on the wire, as in the Composer 2 report. Dropless
    # instead: ep_capacity_factor = 0 (ep_exchange 'auto' then sends ragged slices).
    c.model.moe.ep_capacity_factor = 1.25
    c.model.moe.ep_dispatch_quant = "mxfp8"
    # Flash-style tiles: dense float32 scores [heads, t, 32k] alone would need ~63 MB per
    # token (docs/scaling.md, "Plans for the 32k and 256k phases"). 'auto' runs cuDNN
    # flash attention on GPUs where it can express the mask and the blockwise tiles
    # elsewhere (c2jax.model.fused_attention.select_attention).
    c.model.attention_impl = "auto"
    c.parallel.mesh.expert = 8
    c.parallel.mesh.context = 2
    if c.model.num_mtp_layers:  # DeepSeek-V3: MTP shifts tokens along the sequence and
      c.parallel.context_load_balance = False  # needs them in order: contiguous shards
  return c
