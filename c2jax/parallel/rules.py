"""Logical-axis rules: (logical name, mesh axes) pairs in priority order.

Flax assigns each array dimension the first rule whose mesh axes are still free in that
array, so one name can serve parameters and activations: a parameter's 'embed' dimension
is sharded over fsdp, while an activation whose 'batch' already took fsdp keeps 'embed'
replicated.
"""

from __future__ import annotations

import flax.linen as nn
import jax

DEFAULT_RULES = (
    ("batch", ("data", "fsdp", "expert")),
    ("length", "context"),
    ("embed", ("fsdp", "context")),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("expert", "expert"),
    ("expert_mlp", "tensor"),
    ("q_lora", None),
    ("kv_lora", None),
    ("head_dim", None),
    ("layers", None),
    ("cache_length", None),
)


def rules_of(parallel_cfg) -> tuple:
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes)
               for name, axes in parallel_cfg.rules)


def logical_shardings(logical_specs, mesh, rules):
  """NamedShardings for a pytree of logical PartitionSpecs (e.g. model.param_axes(cfg))."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


def replicated(mesh) -> jax.sharding.NamedSharding:
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
