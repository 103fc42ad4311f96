"""Logical-axis rules: (logical name, mesh axes) pairs in priority order.

Flax assigns each array dimension the first rule whose mesh axes are all still free in
that array, so one name can serve parameters and activations: a parameter's 'embed'
dimension is sharded over fsdp (and context, expert), while an activation whose 'batch'
already took fsdp keeps 'embed' replicated. A name may appear in several rules, tried in
order.
"""

from __future__ import annotations

DEFAULT_RULES = (
    ("batch", ("data", "fsdp", "expert")),
    ("length", "context"),
    # Before 'embed': rules are applied in this order, and an expert weight's 'expert'
    # dimension must claim the expert axis before its 'embed' dimension is considered.
    ("expert", "expert"),
    # Dense parameters shard over every data-like axis; expert weights, whose 'expert'
    # dimension already took the expert axis, fall through to the next rule.
    ("embed", ("fsdp", "context", "expert")),
    ("embed", ("fsdp", "context")),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("expert_mlp", "tensor"),
    # MLA up-projections ([q_lora | kv_lora, heads, head_dim]) would otherwise be
    # replicated: over 1 GB per device at Kimi-K2.5 scale (see `c2jax plan --shardings`).
    ("q_lora", ("fsdp", "context")),
    ("kv_lora", ("fsdp", "context")),
    ("head_dim", None),
    ("layers", None),
    ("cache_length", None),
)


def rules_of(parallel_cfg) -> tuple:
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes)
               for name, axes in parallel_cfg.rules)

