"""How a CPU decode layout may store the Linear projections' kernels
(model.unstack_layers' projection_layout): as model.init stores them, in column pieces,
transposed ('kernel_t'), or in 32-column panels for c2jax_kernels.cpu_matmul
('kernel_p'); `relayout` applies a layout to a tree, `join` undoes it."""

from __future__ import annotations

import math

import jax.numpy as jnp
from c2jax_kernels import cpu_matmul

from c2jax.model import layers

# Linear projections a decode layout may store another way (projection_layout), by module
# name, with how many leading kernel axes each contracts; MLA's kv_b_proj is left whole
# (its absorbed decode multiplies by the kernel itself), as are routers and experts.
INPUT_AXES = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2, "q_a_proj": 1,
              "q_b_proj": 1, "kv_a_proj": 1, "gate_proj": 1, "up_proj": 1, "down_proj": 1,
              "lm_head": 1}
TRANSPOSED = "transposed"
PANELS = "panels"


def kernel_shapes(tree, stacked: bool, found: set) -> None:
  """Adds (name, in_shape, out_shape) of each projection kernel in `tree` to `found`
  (`stacked`: the kernels carry a leading layer axis, left out)."""
  if not isinstance(tree, dict):
    return
  for key, value in tree.items():
    if key in INPUT_AXES and isinstance(value, dict) and hasattr(value.get("kernel"), "shape"):
      shape = tuple(value["kernel"].shape[1:] if stacked else value["kernel"].shape)
      found.add((key, shape[:INPUT_AXES[key]], shape[INPUT_AXES[key]:]))
    kernel_shapes(value, stacked, found)


def relayout(tree, projection_layout):
  """`tree` with every projection kernel stored as projection_layout says."""
  if not isinstance(tree, dict):
    return tree
  out = {}
  for key, value in tree.items():
    if (key in INPUT_AXES and isinstance(value, dict)
        and hasattr(value.get("kernel"), "shape")):
      kernel = value["kernel"]
      n_in = INPUT_AXES[key]
      layout = projection_layout(key, math.prod(kernel.shape[:n_in]),
                                 math.prod(kernel.shape[n_in:]))
      rest = {k: v for k, v in value.items() if k != "kernel"}
      if layout == TRANSPOSED:
        perm = (*range(n_in, kernel.ndim), *range(n_in))
        value = {**rest, "kernel_t": jnp.transpose(kernel, perm)}
      elif layout == PANELS:
        width = cpu_matmul.PANEL
        if kernel.shape[-1] % width or kernel.dtype != jnp.float32:
          raise ValueError(f"projection_layout({key!r}, ...) gave {PANELS!r} for a "
                           f"{kernel.dtype} kernel {kernel.shape}: panels need float32 and "
                           f"a last axis that is a multiple of {width}.")
        # [*in, *out_lead, last] -> [*out_lead, last / width, *in, width]
        split = kernel.reshape(*kernel.shape[:-1], kernel.shape[-1] // width, width)
        perm = (*range(n_in, split.ndim - 1), *range(n_in), split.ndim - 1)
        value = {**rest, "kernel_p": jnp.transpose(split, perm)}
      elif isinstance(layout, int) and layout > 1:
        value = {**rest, "kernel": layers.split_columns(kernel, layout)}
      elif layout != 1:
        raise ValueError(f"projection_layout({key!r}, ...) gave {layout!r}; return a number "
                         f"of column pieces (1 keeps the kernel), {TRANSPOSED!r} or "
                         f"{PANELS!r}.")
    out[key] = relayout(value, projection_layout)
  return out


def join(tree):
  """Inverse of relayout: every kernel back as model.init stores it."""
  if not isinstance(tree, dict):
    return tree
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict) and "kernel_p" in value:
      kernel_p = value["kernel_p"]
      n_in = INPUT_AXES[key]
      lead = kernel_p.ndim - n_in - 1  # out_lead axes and the panel axis
      perm = (*range(lead, lead + n_in), *range(lead), kernel_p.ndim - 1)
      joined = jnp.transpose(kernel_p, perm)
      value = {**{k: v for k, v in value.items() if k != "kernel_p"},
               "kernel": joined.reshape(*joined.shape[:-2], -1)}
    elif isinstance(value, dict) and "kernel_t" in value:
      kernel_t = value["kernel_t"]
      n_out = kernel_t.ndim - INPUT_AXES[key]
      perm = (*range(n_out, kernel_t.ndim), *range(n_out))
      value = {**{k: v for k, v in value.items() if k != "kernel_t"},
               "kernel": jnp.transpose(kernel_t, perm)}
    elif isinstance(value, dict) and isinstance(value.get("kernel"), (tuple, list)):
      value = {**value, "kernel": layers.join_columns(value["kernel"])}
    out[key] = join(value)
  return out
