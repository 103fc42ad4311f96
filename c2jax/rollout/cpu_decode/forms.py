"""The projection kernel forms of the CPU decode layout, registered with the model's Linear
(c2jax.model.projections) when this module is imported.

A projection_layout(name, inputs, outputs) says how to store each projection kernel of
[*in, *out] that `relayout` meets (`name` e.g. 'down_proj' or 'lm_head'; inputs and
outputs the sizes it contracts and produces):
  1           as model.init stores it ('kernel');
  n > 1       in n column pieces ('kernel_pieces', split_columns: a tuple of arrays that
              split its last axis; one dot per piece, the outputs concatenated: XLA:CPU
              runs a narrow few-row product faster, and the pieces on several cores);
  TRANSPOSED  output axes first ('kernel_t' [*out, *in]), multiplied as one 2-D product;
  PANELS      in 32-column panels for c2jax_kernels.cpu_matmul ('kernel_p' [*out[:-1],
              out[-1] / 32, *in, 32]; float32, a last output axis that is a multiple of 32,
              XLA:CPU only), its panel matmul up to cpu_matmul.MAX_ROWS rows, XLA's beyond.
model.stack_layers joins every form back.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from c2jax_kernels import cpu_matmul

from c2jax import model
from c2jax.model import projections

TRANSPOSED, PANELS = "transposed", "panels"
TRANSPOSED_PARAM, PIECES_PARAM, PANELS_PARAM = "kernel_t", "kernel_pieces", "kernel_p"


def split_columns(kernel: jax.Array, pieces: int) -> tuple[jax.Array, ...]:
  """`kernel`'s last axis cut into `pieces` contiguous blocks of near-equal width (the
  first ones one wider when it does not divide), each its own array (docs/benchmarks.md,
  "Decode against the JAX peers")."""
  width = kernel.shape[-1]
  if not 1 <= pieces <= width:
    raise ValueError(f"split_columns: {pieces} pieces of a kernel {kernel.shape}; use 1 to "
                     f"{width} (its last axis).")
  bounds = np.cumsum([0] + [width // pieces + (i < width % pieces) for i in range(pieces)])
  return tuple(kernel[..., start:stop] for start, stop in zip(bounds[:-1], bounds[1:]))


def join_columns(pieces) -> jax.Array:
  """Inverse of split_columns."""
  return jnp.concatenate(list(pieces), axis=-1)


def _pieces_product(x, pieces, in_shape, out_shape, dtype, out_dtype):
  return jnp.concatenate([projections.plain_product(x, piece, in_shape, out_shape, dtype,
                                                    out_dtype) for piece in pieces], axis=-1)


def _pieces_problem(pieces, in_shape, out_shape):
  # Checked here: Flax's own shape check would compare a tuple's first leaf only.
  shape = (*in_shape, *out_shape)
  if (isinstance(pieces, (tuple, list))
      and all(piece.shape[:-1] == shape[:-1] for piece in pieces)
      and sum(piece.shape[-1] for piece in pieces) == shape[-1]):
    return None
  got = ([piece.shape for piece in pieces] if isinstance(pieces, (tuple, list))
         else f"a {type(pieces).__name__}")
  return (f"column pieces need shapes {shape[:-1]} + (width,) with widths summing to "
          f"{shape[-1]}; got {got}.")


def _transposed_product(x, kernel_t, in_shape, out_shape, dtype, out_dtype):
  # As one 2-D product (rows x K by N x K): with several kernel axes XLA:CPU would copy
  # the kernel into [K, N] order on every call.
  k, n = math.prod(in_shape), math.prod(out_shape)
  lead = x.shape[:x.ndim - len(in_shape)]
  y = jax.lax.dot_general(x.astype(dtype).reshape(-1, k), kernel_t.astype(dtype).reshape(n, k),
                          (((1,), (1,)), ((), ())), preferred_element_type=out_dtype)
  return y.reshape(*lead, *out_shape)


def _transposed_problem(kernel_t, in_shape, out_shape):
  want = (*out_shape, *in_shape)
  if kernel_t.shape == want:
    return None
  return f"a transposed kernel needs shape {want} (outputs, then inputs); got {kernel_t.shape}."


def _transposed_join(kernel_t, n_in):
  n_out = kernel_t.ndim - n_in
  return jnp.transpose(kernel_t, (*range(n_out, kernel_t.ndim), *range(n_out)))


def _panels_product(x, kernel_p, in_shape, out_shape, dtype, out_dtype):
  k, n = math.prod(in_shape), math.prod(out_shape)
  lead = x.shape[:x.ndim - len(in_shape)]
  panels = kernel_p.astype(jnp.float32).reshape(n // cpu_matmul.PANEL, k, cpu_matmul.PANEL)
  rows = x.astype(jnp.float32).reshape(-1, k)
  if rows.shape[0] <= cpu_matmul.MAX_ROWS:
    y = cpu_matmul.panel_matmul(rows, panels)
  else:  # a long prefill chunk: XLA's matmul, whose packing pays over many rows
    y = rows @ cpu_matmul.unpack(panels)
  return y.astype(out_dtype or dtype).reshape(*lead, *out_shape)


def _panels_problem(kernel_p, in_shape, out_shape):
  *lead, last = out_shape
  want = (*lead, last // cpu_matmul.PANEL, *in_shape, cpu_matmul.PANEL)
  if last % cpu_matmul.PANEL == 0 and kernel_p.shape == want:
    return None
  return (f"a kernel in column panels needs shape {want} (outputs' last axis a multiple of "
          f"{cpu_matmul.PANEL}); got {kernel_p.shape} for in {tuple(in_shape)}, out "
          f"{tuple(out_shape)}.")


def _panels_join(kernel_p, n_in):
  lead = kernel_p.ndim - n_in - 1  # the outputs' leading axes and the panel axis
  joined = jnp.transpose(kernel_p, (*range(lead, lead + n_in), *range(lead), kernel_p.ndim - 1))
  return joined.reshape(*joined.shape[:-2], -1)


projections.register(PIECES_PARAM, projections.KernelForm(
    _pieces_product, _pieces_problem, lambda pieces, n_in: join_columns(pieces)))
projections.register(TRANSPOSED_PARAM, projections.KernelForm(
    _transposed_product, _transposed_problem, _transposed_join))
projections.register(PANELS_PARAM, projections.KernelForm(
    _panels_product, _panels_problem, _panels_join))


def store(form, kernel: jax.Array, n_in: int, name: str = "kernel") -> dict:
  """{param name: stored value} of a [*in, *out] kernel (`n_in` input axes) in `form`
  (module docstring); `name` is the projection's, for errors."""
  if form == TRANSPOSED:
    return {TRANSPOSED_PARAM: jnp.transpose(kernel, (*range(n_in, kernel.ndim),
                                                     *range(n_in)))}
  if form == PANELS:
    width = cpu_matmul.PANEL
    if kernel.shape[-1] % width or kernel.dtype != jnp.float32:
      raise ValueError(f"projection_layout({name!r}, ...) gave {PANELS!r} for a "
                       f"{kernel.dtype} kernel {kernel.shape}: panels need float32 and a last "
                       f"axis that is a multiple of {width}.")
    # [*in, *out_lead, last] -> [*out_lead, last / width, *in, width]
    split = kernel.reshape(*kernel.shape[:-1], kernel.shape[-1] // width, width)
    perm = (*range(n_in, split.ndim - 1), *range(n_in), split.ndim - 1)
    return {PANELS_PARAM: jnp.transpose(split, perm)}
  if isinstance(form, int) and form > 1:
    return {PIECES_PARAM: split_columns(kernel, form)}
  if form != 1:
    raise ValueError(f"projection_layout({name!r}, ...) gave {form!r}; return a number of "
                     f"column pieces (1 keeps the kernel), {TRANSPOSED!r} or {PANELS!r}.")
  return {projections.PLAIN: kernel}


def relayout(params, projection_layout) -> dict:
  """model.unstack_layers' tree with each layer's and the LM head's projection kernel
  stored as projection_layout(name, inputs, outputs) says (module docstring); None keeps
  every kernel as it is."""
  if projection_layout is None:
    return params

  def store_one(name, kernel, n_in):
    form = projection_layout(name, math.prod(kernel.shape[:n_in]),
                             math.prod(kernel.shape[n_in:]))
    return store(form, kernel, n_in, name)
  return model.store_projections(params, store_one)
