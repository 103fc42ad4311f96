"""Model configs by variant: `--config=configs/models.py:<variant>`.

Variants (c2jax/model/variants.py): tiny, small, qwen3_tiny, qwen3_small (dense Qwen3),
moe_8b_a1b, deepseek_v3, kimi_k25, qwen3_moe_30b_a3b.
Example: c2jax plan --config=configs/models.py:kimi_k25 --count
"""

from c2jax.model import variants

TEST_ARGS = tuple(variants.VARIANTS)


def get_config(variant: str = "tiny"):
  return variants.get(variant or "tiny")
