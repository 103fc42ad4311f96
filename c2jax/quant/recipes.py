"""The recipe registry behind `config.quant` (see c2jax/quant/__init__.py)."""

import dataclasses
from typing import Callable

import jax.numpy as jnp

import c2jax_kernels as kernels


@dataclasses.dataclass(frozen=True)
class Recipe:
  dot: Callable  # (x, w, *, preferred_element_type) -> [..., N]
  grouped_dot: Callable  # (lhs, rhs, group_sizes, *, impl, rows, preferred_element_type)


def _plain_dot(x, w, *, preferred_element_type=None):
  out = jnp.dot(x, w, preferred_element_type=jnp.float32)
  return out.astype(preferred_element_type or x.dtype)


def _block_scaled(name):
  def dot_fn(x, w, *, preferred_element_type=None):
    return kernels.block_scaled_matmul(x, w, recipe=name,
                                       preferred_element_type=preferred_element_type)

  def grouped_fn(lhs, rhs, group_sizes, *, impl=None, rows=None,
                 preferred_element_type=None):
    # The kernel path (fused FP8 on Hopper, dequantise elsewhere) follows the device.
    return kernels.block_scaled_grouped_matmul(
        lhs, rhs, group_sizes, recipe=name, impl=impl, rows=rows,
        preferred_element_type=preferred_element_type)
  return Recipe(dot=dot_fn, grouped_dot=grouped_fn)


def _plain_grouped(lhs, rhs, group_sizes, *, impl=None, rows=None,
                   preferred_element_type=None):
  if rows is not None:
    lhs = jnp.take(lhs, rows, axis=0)
  return kernels.grouped_matmul(lhs, rhs, group_sizes, impl=impl,
                                preferred_element_type=preferred_element_type)


# The block-scaled names come from the kernels' own registry: one source of truth.
RECIPES = {'none': Recipe(dot=_plain_dot, grouped_dot=_plain_grouped),
           **{name: _block_scaled(name) for name in kernels.BLOCK_SCALED_RECIPES}}


def check_recipe(recipe):
  if recipe not in RECIPES:
    raise ValueError(f"Unknown quant recipe {recipe!r} (config.quant); choose one of "
                     f"{sorted(RECIPES)}.")
  return RECIPES[recipe]


def dot(recipe, x, w, *, preferred_element_type=None):
  """x [..., K] @ w [K, N] under `recipe`."""
  return check_recipe(recipe).dot(x, w, preferred_element_type=preferred_element_type)


def grouped_dot(recipe, lhs, rhs, group_sizes, *, impl=None, rows=None,
                preferred_element_type=None):
  """The MoE expert matmul under `recipe`; same contract as kernels.grouped_matmul.

  rows: optional [M] token index of each sorted row; lhs is then [T, K] (the tokens before
  dispatch), so quantised recipes quantise once per token and gather low-precision values.
  """
  return check_recipe(recipe).grouped_dot(lhs, rhs, group_sizes, impl=impl, rows=rows,
                                          preferred_element_type=preferred_element_type)
