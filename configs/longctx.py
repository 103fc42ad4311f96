"""Phase 2: long-context extension, initialised from the pretraining phase.

8x the pretraining sequence length, with YaRN RoPE scaling over the pretraining length
(real scale: 32k -> 256k tokens).
  c2jax pretrain --config=configs/longctx.py:tiny --workdir=runs/tiny/longctx
init_from defaults to runs/<variant>/pretrain; override with --config.init_from=DIR.
"""

import pathlib

from c2jax import config as configlib

TEST_ARGS = ("tiny", "kimi_k25")
LENGTH_FACTOR = 8


def get_config(variant: str = "tiny"):
  variant = variant or "tiny"
  c = configlib.load_config_file(pathlib.Path(__file__).with_name("pretrain.py"), variant)
  short = c.train.seq_len
  c.train.seq_len = short * LENGTH_FACTOR
  c.train.batch_size = max(c.train.batch_size // LENGTH_FACTOR, 1)
  c.train.steps = max(c.train.steps // 4, 1)
  c.train.learning_rate = c.train.learning_rate / 3
  c.train.eval_every = max(c.train.steps // 2, 1)
  c.train.checkpoint_every = max(c.train.steps // 2, 1)
  # The model is inherited from init_from; the YaRN extension is this phase's declared
  # change (c2jax/model/lineage.py). Real-scale variants already ship YaRN for 256k.
  c.model_changes = ()
  if c.model.rope.scaling != "yarn":
    c.model_changes = ("rope.scaling", "rope.factor", "rope.original_max_position",
                       "rope.mscale", "rope.mscale_all_dim")
    c.model.rope.scaling = "yarn"
    c.model.rope.factor = float(LENGTH_FACTOR)
    c.model.rope.original_max_position = short
    c.model.rope.mscale = 1.0
    c.model.rope.mscale_all_dim = 1.0 if c.model.attention == "mla" else 0.0
  c.model.max_position = max(c.model.max_position, c.train.seq_len)
  if c.parallel.mesh.context > 1:  # real scale: 256k-token rows, 32 of them per step
    # 32 context shards (8,192 tokens per device) keep the 32 rows divisible by the
    # batch axes on 256 or 1,024 chips; pretraining's CP=2 would leave 128 or 512 batch
    # ways for 32 rows (docs/scaling.md, "Plans for the 32k and 256k phases").
    c.parallel.mesh.context = 32
  c.init_from = f"runs/{variant}/pretrain"
  return c
