"""The whole pipeline, end to end: pretrain -> long context -> agent traces -> SFT.

  c2jax pipeline --config=configs/pipeline.py:tiny --workdir=runs/tiny
Stage workdirs are WORKDIR/<stage>; each stage config is the phase's own config file
(configs/pretrain.py, longctx.py, sft.py) for the same variant, chained by checkpoint.
Override a stage's fields with e.g. --config.pretrain.train.steps=50; data fields are
shared by all stages: --config.data.max_total_bytes=...
Add "rl" last to stages with an `rl` section (a configs/rl.py job) to end in RL, as
configs/agent_sft.py:tiny_rl does (c2jax/commands/pipeline.py).
"""

import pathlib

import ml_collections

from c2jax import config as configlib
from c2jax.agent import config as agent_config

TEST_ARGS = ("tiny",)
HERE = pathlib.Path(__file__).parent


def get_config(variant: str = "tiny"):
  variant = variant or "tiny"
  c = ml_collections.ConfigDict()
  c.stages = ("pretrain", "longctx", "traces", "sft")
  c.pretrain = configlib.load_config_file(HERE / "pretrain.py", variant)
  c.longctx = configlib.load_config_file(HERE / "longctx.py", variant)
  c.sft = configlib.load_config_file(HERE / "sft.py", variant)
  # One corpus and tokenizer for every stage (the pipeline copies this into each stage):
  # a stage with its own tokenizer could not continue from the previous checkpoint.
  c.data = c.pretrain.data.copy_and_resolve_references()
  # Procedurally generated repositories solved by the scripted solver through the real
  # tools: the SFT phase's agent traces; `heldout` of them measure held-out SFT loss.
  c.traces = ml_collections.ConfigDict(
      {"count": 48, "heldout": 8, "seed": 0, "backend": "bubblewrap",
       "difficulties": (1, 2, 3, 4), "tools": agent_config.default_config().tools})
  return c
