"""MoE grouped matmul: one function, six implementations, one reference (see api.py)."""

from c2jax_kernels.grouped_matmul.api import DEFAULT_IMPL_BY_PLATFORM
from c2jax_kernels.grouped_matmul.api import IMPLS
from c2jax_kernels.grouped_matmul.api import default_impl
from c2jax_kernels.grouped_matmul.api import grouped_matmul

__all__ = ['DEFAULT_IMPL_BY_PLATFORM', 'IMPLS', 'default_impl', 'grouped_matmul']
