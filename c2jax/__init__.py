"""c2jax: a JAX/Flax reproduction of the Composer 2 coding-agent training system.

Public faces: `c2jax.model` (the MoE transformer) and `c2jax.hf` (HF checkpoint interop).
"""

__version__ = "0.1.0"
