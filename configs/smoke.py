"""A few training steps of a model variant on a synthetic next-token task.

The quickstart's main job until the full pipeline lands:
  c2jax smoke --config=configs/smoke.py:tiny
  c2jax smoke --config=configs/smoke.py:small --config.steps=50
"""

import ml_collections

from c2jax.model import variants


def get_config(variant: str = "tiny"):
  c = ml_collections.ConfigDict()
  c.model = variants.get(variant or "tiny")
  c.seed = 0
  c.steps = 60
  c.batch_size = 4
  c.seq_len = 64
  c.learning_rate = 3e-3
  c.warmup_steps = 10
  c.log_every = 10
  return c
