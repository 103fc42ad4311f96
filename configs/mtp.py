"""Multi-token prediction attached to a frozen pretraining checkpoint (report §3.1).

The MTP module is initialised from scratch and trained alone by self-distillation: at each
position it matches the frozen main head's full distribution (KL to its stop-gradient
softmax). The trunk, embedding and LM head are restored from init_from and do not change.
  c2jax pretrain --config=configs/pretrain.py:tiny --workdir=runs/tiny/pretrain
  c2jax pretrain --config=configs/mtp.py:tiny --workdir=runs/tiny/mtp
init_from defaults to runs/<variant>/pretrain; a checkpoint without MTP modules is the
normal case (the loop restores the trunk and logs that the MTP modules start fresh).
Add data cross-entropy with --config.train.mtp_ce_weight=0.1. Measure the drafter with
  python -m tools.bench.decode --checkpoint runs/tiny/mtp --batches 1,8
"""

import pathlib

from c2jax import config as configlib

TEST_ARGS = ("tiny", "small", "kimi_k25")


def get_config(variant: str = "tiny"):
  variant = variant or "tiny"
  # The pretraining config of the same variant: same model, corpus and tokenizer.
  c = configlib.load_config_file(pathlib.Path(__file__).with_name("pretrain.py"), variant)
  c.model.num_mtp_layers = 1  # DeepSeek-V3 / Kimi: one depth, reused for longer drafts
  # MTP shifts tokens along the sequence: context shards must keep them in order.
  c.parallel.context_load_balance = False
  # The rest of the model is the pretraining checkpoint's; the MTP module is this phase's
  # declared change.
  c.model_changes = ("num_mtp_layers",)
  c.train.mtp_frozen_trunk = True
  c.train.mtp_kl_weight = 1.0
  c.train.mtp_ce_weight = 0.0
  c.train.checkpoint_every = max(c.train.steps // 2, 1)
  # A frozen trunk's eval loss cannot move; the MTP module's quality is in the train
  # metrics (mtp0/kl, mtp0/agree = greedy acceptance rate) and the decode benchmark.
  c.train.eval_every = 0
  c.init_from = f"runs/{variant}/pretrain"
  return c
