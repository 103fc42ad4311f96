"""Basic layers: logically-partitioned parameters, projections, RMSNorm, embedding, MLP.

Every parameter is created through `logical_param`, so it carries logical axis names
(see c2jax.parallel for the logical -> mesh rules); no module here knows the mesh.
Kernels follow Flax's [in..., out...] convention.

Einsum/shape legend: B batch, L length, D hidden (embed), V vocab, F MLP width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from c2jax_kernels import cpu_matmul

Axes = tuple[str | None, ...]


def logical_param(module: nn.Module, name: str, init_fn, shape: Sequence[int], axes: Axes,
                  dtype) -> jax.Array:
  """`module.param` whose value is boxed with logical axis names (one per dimension)."""
  shape = tuple(int(s) for s in shape)
  if len(shape) != len(axes):
    raise ValueError(f"{module.name}/{name}: shape {shape} needs {len(shape)} logical axis "
                     f"names, got {axes}.")
  return module.param(name, nn.with_logical_partitioning(init_fn, axes), shape, dtype)


def constrain(x: jax.Array, axes: Axes) -> jax.Array:
  """Logical sharding constraint on an activation (a no-op outside a mesh with rules)."""
  return nn.with_logical_constraint(x, axes)


def param_dtype(cfg) -> jnp.dtype:
  return jnp.dtype(cfg.param_dtype)


def compute_dtype(cfg) -> jnp.dtype:
  return jnp.dtype(cfg.dtype)


class Linear(nn.Module):
  """A bias-free projection contracting the trailing `len(in_shape)` axes of x.

  kernel shape = in_shape + out_shape (e.g. [D, H, hd] for a multi-head projection, or
  [H, hd, D] for an output projection), named by `axes`. Built in `setup` so a parent can
  read `.kernel` directly (MLA's absorbed decode multiplies by the kernel itself).
  `out_dtype` (e.g. float32 for logits) accumulates and returns in that dtype instead of
  rounding to cfg.dtype.
  A CPU decode engine may store the kernel another way (model.unstack_layers'
  projection_layout), same function: as column pieces (split_columns: a tuple of arrays
  that split its last axis; one dot per piece, the outputs concatenated; `.kernel` is then
  that tuple), transposed, as 'kernel_t' [*out_shape, *in_shape] (`.kernel` is None), or
  in column panels for c2jax_kernels.cpu_matmul, as 'kernel_p' [*out_shape[:-1],
  out_shape[-1] / 32, *in_shape, 32] (float32, XLA:CPU only; `.kernel` is None).
  """
  in_shape: tuple[int, ...]
  out_shape: tuple[int, ...]
  axes: Axes
  cfg: object
  out_dtype: str | None = None

  def setup(self):
    shape = (*self.in_shape, *self.out_shape)
    self.kernel_t = self.kernel_p = None
    if self.has_variable("params", "kernel_p"):
      stored = self.get_variable("params", "kernel_p")
      *lead, last = self.out_shape
      want = (*lead, last // cpu_matmul.PANEL, *self.in_shape, cpu_matmul.PANEL)
      if last % cpu_matmul.PANEL or stored.shape != want:
        raise ValueError(f"{self.name}/kernel_p: a kernel in column panels needs shape {want}"
                         f" (outputs' last axis a multiple of {cpu_matmul.PANEL}); got "
                         f"{stored.shape} for in {self.in_shape}, out {self.out_shape}.")
      self.kernel_p, self.kernel = stored, None
      return
    if self.has_variable("params", "kernel_t"):
      stored = self.get_variable("params", "kernel_t")
      want = (*self.out_shape, *self.in_shape)
      if stored.shape != want:
        raise ValueError(f"{self.name}/kernel_t: a transposed kernel needs shape {want} "
                         f"(outputs, then inputs); got {stored.shape}.")
      self.kernel_t, self.kernel = stored, None
      return
    if self.has_variable("params", "kernel"):
      stored = self.get_variable("params", "kernel")
      if isinstance(stored, (tuple, list)):
        # Checked here: Flax's own shape check compares a tuple's first leaf only.
        joined = (*shape[:-1], sum(piece.shape[-1] for piece in stored))
        if any(piece.shape[:-1] != shape[:-1] for piece in stored) or joined != shape:
          raise ValueError(f"{self.name}/kernel: column pieces need shapes {shape[:-1]} + "
                           f"(width,) with widths summing to {shape[-1]}; got "
                           f"{[piece.shape for piece in stored]}.")
        self.kernel = tuple(stored)
        return
    self.kernel = logical_param(self, "kernel", nn.initializers.normal(self.cfg.init_std),
                                shape, self.axes, param_dtype(self.cfg))

  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = compute_dtype(self.cfg)
    n_in = len(self.in_shape)
    contract = (tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in)))

    def dot(kernel):
      return jax.lax.dot_general(x.astype(dtype), kernel.astype(dtype), (contract, ((), ())),
                                 preferred_element_type=self.out_dtype)

    if self.kernel_p is not None:
      k, n = math.prod(self.in_shape), math.prod(self.out_shape)
      lead = x.shape[:x.ndim - n_in]
      panels = self.kernel_p.astype(jnp.float32).reshape(n // cpu_matmul.PANEL, k,
                                                        cpu_matmul.PANEL)
      rows = x.astype(jnp.float32).reshape(-1, k)
      if rows.shape[0] <= cpu_matmul.MAX_ROWS:
        y = cpu_matmul.panel_matmul(rows, panels)
      else:  # a long prefill chunk: XLA's matmul, whose packing pays over many rows
        y = rows @ cpu_matmul.unpack(panels)
      return y.astype(self.out_dtype or dtype).reshape(*lead, *self.out_shape)
    if self.kernel_t is not None:
      # As one 2-D product (rows x K by N x K): with several kernel axes XLA:CPU would
      # copy the kernel into [K, N] order on every call.
      k, n = math.prod(self.in_shape), math.prod(self.out_shape)
      lead = x.shape[:x.ndim - n_in]
      y = jax.lax.dot_general(x.astype(dtype).reshape(-1, k),
                              self.kernel_t.astype(dtype).reshape(n, k),
                              (((1,), (1,)), ((), ())), preferred_element_type=self.out_dtype)
      return y.reshape(*lead, *self.out_shape)
    if isinstance(self.kernel, tuple):
      return jnp.concatenate([dot(piece) for piece in self.kernel], axis=-1)
    return dot(self.kernel)


def split_columns(kernel: jax.Array, pieces: int) -> tuple[jax.Array, ...]:
  """`kernel`'s last axis cut into `pieces` contiguous blocks of near-equal width (the
  first ones one wider when it does not divide), each its own array: Linear runs one dot
  per block. On XLA:CPU a narrow matrix-vector or few-row product runs faster, and the
  blocks' independent dots run on several cores at once (docs/benchmarks.md, "Decode
  against the JAX peers")."""
  width = kernel.shape[-1]
  if not 1 <= pieces <= width:
    raise ValueError(f"split_columns: {pieces} pieces of a kernel {kernel.shape}; use 1 to "
                     f"{width} (its last axis).")
  bounds = np.cumsum([0] + [width // pieces + (i < width % pieces) for i in range(pieces)])
  return tuple(kernel[..., start:stop] for start, stop in zip(bounds[:-1], bounds[1:]))


def join_columns(pieces) -> jax.Array:
  """Inverse of split_columns."""
  return jnp.concatenate(list(pieces), axis=-1)


class RMSNorm(nn.Module):
  """y = x / sqrt(mean(x^2) + eps) * scale, normalised in float32 then cast back (as HF)."""
  dim: int
  axis_name: str
  cfg: object

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = logical_param(self, "scale", nn.initializers.ones, (self.dim,), (self.axis_name,),
                          param_dtype(self.cfg))
    x32 = x.astype(jnp.float32)
    variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    normed = (x32 * jax.lax.rsqrt(variance + self.cfg.rms_norm_eps)).astype(x.dtype)
    return normed * scale.astype(x.dtype)


class Embed(nn.Module):
  """Token embedding table [V, D]; the LM head is a separate (untied) Linear."""
  cfg: object

  @nn.compact
  def __call__(self, tokens_BxL: jax.Array) -> jax.Array:
    cfg = self.cfg
    table_VxD = logical_param(self, "embedding", nn.initializers.normal(cfg.init_std),
                              (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"),
                              param_dtype(cfg))
    # Cast the (sharded) table, not the gathered rows: with float32 masters and bfloat16
    # compute the gathered activations are born bfloat16, half the bytes.
    x_BxLxD = jnp.take(table_VxD.astype(compute_dtype(cfg)), tokens_BxL, axis=0)
    return constrain(x_BxLxD, ("batch", "length", "embed"))


class MLP(nn.Module):
  """SwiGLU feed-forward: down(silu(gate(x)) * up(x)); `width` F (dense or shared-expert)."""
  width: int
  cfg: object

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    d, f = self.cfg.hidden_size, self.width
    gate_BxLxF = Linear((d,), (f,), ("embed", "mlp"), self.cfg, name="gate_proj")(x_BxLxD)
    up_BxLxF = Linear((d,), (f,), ("embed", "mlp"), self.cfg, name="up_proj")(x_BxLxD)
    h_BxLxF = constrain(nn.silu(gate_BxLxF) * up_BxLxF, ("batch", "length", "mlp"))
    y_BxLxD = Linear((f,), (d,), ("mlp", "embed"), self.cfg, name="down_proj")(h_BxLxF)
    return constrain(y_BxLxD, ("batch", "length", "embed"))
