"""Phase 3: SFT on agent traces (tool calls, edits, multi-step), from the long-context phase.

Loss on assistant tokens only (the chat template's loss mask).
  c2jax sft --config=configs/sft.py:tiny --workdir=runs/tiny/sft \
      --config.sft.train_path=traces/train.jsonl --config.sft.heldout_path=traces/heldout.jsonl
init_from defaults to runs/<variant>/longctx.
"""

import pathlib

from c2jax import config as configlib

TEST_ARGS = ("tiny",)


def get_config(variant: str = "tiny"):
  variant = variant or "tiny"
  c = configlib.load_config_file(pathlib.Path(__file__).with_name("longctx.py"), variant)
  c.task = "sft"
  # The long-context model (YaRN included) is inherited from init_from, not changed here.
  c.model_changes = ()
  c.train.steps = max(c.train.steps, 40)
  c.train.learning_rate = c.train.learning_rate / 2
  c.init_from = f"runs/{variant}/longctx"
  c.sft.train_path = f"runs/{variant}/traces/train.jsonl"
  c.sft.heldout_path = f"runs/{variant}/traces/heldout.jsonl"
  return c
