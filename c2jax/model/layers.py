"""Basic layers: logically-partitioned parameters, projections, RMSNorm, embedding, MLP.

Every parameter is created through `logical_param`, so it carries logical axis names
(see c2jax.parallel for the logical -> mesh rules); no module here knows the mesh.
Kernels follow Flax's [in..., out...] convention.

Einsum/shape legend: B batch, L length, D hidden (embed), V vocab, F MLP width.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from c2jax.model import projections

Axes = tuple[str | None, ...]


def logical_param(module: nn.Module, name: str, init_fn, shape: Sequence[int], axes: Axes,
                  dtype) -> jax.Array:
  """`module.param` whose value is boxed with logical axis names (one per dimension)."""
  shape = tuple(int(s) for s in shape)
  if len(shape) != len(axes):
    raise ValueError(f"{module.name}/{name}: shape {shape} needs {len(shape)} logical axis "
                     f"names, got {axes}.")
  if module.has_variable("params", name):
    # Applying: Flax checks the given value's shape against an eval_shape of the init
    # function, a trace of the initialiser (a truncated normal is erf_inv and more) for
    # every parameter of every apply; zeros of the shape asked for check the same.
    return module.param(name, nn.initializers.zeros, shape, dtype)
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
  A decode engine may store the kernel in another form it registered
  (c2jax.model.projections), under that form's param name in place of 'kernel': the
  same function, through the form's product; `.kernel` is then None.
  """
  in_shape: tuple[int, ...]
  out_shape: tuple[int, ...]
  axes: Axes
  cfg: object
  out_dtype: str | None = None

  def setup(self):
    self.form = projections.form_of(self.name, self.variables.get("params", {}))
    if self.form == projections.PLAIN:
      # Creates the kernel at init; later reads it, Flax checking its shape.
      self.kernel = logical_param(self, projections.PLAIN,
                                  nn.initializers.normal(self.cfg.init_std),
                                  (*self.in_shape, *self.out_shape), self.axes,
                                  param_dtype(self.cfg))
      self.stored = self.kernel
      return
    stored = self.get_variable("params", self.form)
    problem = projections.FORMS[self.form].problem(stored, self.in_shape, self.out_shape)
    if problem:
      raise ValueError(f"{self.name}/{self.form}: {problem}")
    self.kernel, self.stored = None, stored

  def __call__(self, x: jax.Array) -> jax.Array:
    return projections.FORMS[self.form].product(x, self.stored, self.in_shape,
                                                self.out_shape, compute_dtype(self.cfg),
                                                self.out_dtype)


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
