"""The whole pipeline, end to end: pretrain -> long context -> agent traces -> SFT -> eval.

  c2jax pipeline --config=configs/pipeline.py:tiny --workdir=runs/tiny
Stage workdirs are WORKDIR/<stage>; each stage config is the phase's own config file
(configs/pretrain.py, longctx.py, sft.py) for the same variant, chained by checkpoint.
Override a stage's fields with e.g. --config.pretrain.train.steps=50; data fields are
shared by all stages: --config.data.max_total_bytes=...
The eval stage is a configs/eval.py job (any suite; here procgen, held-out seeds) that
scores the last trained stage's run with the engine policy; its numbers land in
WORKDIR/summary.json beside every stage's. Another suite: replace the section, e.g.
c.eval = configlib.load_config_file(HERE / "eval.py", "state_tracking,tiny").
Add "rl" before "eval" with an `rl` section (a configs/rl.py job) to train with RL, as
configs/agent_sft.py:tiny_rl does (c2jax/pipeline.py).
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
  c.stages = ("pretrain", "longctx", "traces", "sft", "eval")
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
  # A short held-out check of the SFT model as an agent: fresh procedural tasks (the
  # suite's seeds are not the traces'), one sample each, prompted with the traces' tools
  # and as long a context as SFT trained on. c2jax/pipeline.py points policy.run at the
  # last trained stage.
  c.eval = configlib.load_config_file(HERE / "eval.py", "procgen,tiny")
  c.eval.policy.kind = "engine"
  c.eval.agent.tools = c.traces.tools
  c.eval.suite.args.count = 8
  c.eval.suite.args.difficulties = c.traces.difficulties
  c.eval.eval.samples, c.eval.eval.ks = 1, (1,)
  c.eval.policy.max_length = c.sft.train.seq_len
  c.eval.agent.max_total_tokens = c.sft.train.seq_len
  return c
