"""Weight-only quantised matrices as an inference engine keeps them resident.

    w = quantize_weight(w_ExKxN, "int4")     # WeightQuant: int4 values + float32 scales
    w.values.shape, w.scales.shape           # [E, K, N], [E, K / 32, N]
    dequantize_weight(w, jnp.bfloat16)       # the whole [E, K, N]: tests and references
    dequantize_tile(values, scales, w.block, dtype)   # what the kernels do, a tile at a time

A weight [..., K, N] (K the contraction, N the outputs; leading axes stack layers and
experts) is stored as `values` [..., K, N] in the scheme's narrow dtype and `scales`
[..., K / bk, N / bn] float32, one per block of bk x bn values: w ~= values * scale.
Symmetric, round to nearest; a block of zeros gets scale 1.

Schemes (SCHEMES):
  fp8    float8_e4m3fn values, 128 x 128 blocks, scale = amax / 448: DeepSeek-V3's released
         layout (`weight_scale_inv`, there stored [N, K]-major).
  int8   int8 values, groups of 128 along K per output column, scale = amax / 127.
  int4   int4 values, groups of 32 along K per output column, scale = amax / 7: the layout
         of Kimi-K2.5's released experts (compressed-tensors pack-quantized, symmetric
         groups of 32); values stay in [-7, 7].
A block never exceeds its dimension: a dimension smaller than the block (tiny test models)
is one block; a larger one must divide by it (the error says which). int4 arrays take half
a byte per value in device memory on every XLA backend (the CPU's too); `resident_bytes`
counts them so.

The tree pieces are a registered pytree: `values` and `scales` are its children (placed,
sharded and sliced by nn.scan like any parameter leaves), scheme and block its static data.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Scheme:
  name: str
  dtype: object  # the values' dtype
  block: tuple[int, int]  # (rows along K, columns along N); 1 = one scale per column
  qmax: float  # the largest magnitude a value takes


SCHEMES = {
    "fp8": Scheme("fp8", jnp.float8_e4m3fn, (128, 128), 448.0),
    "int8": Scheme("int8", jnp.int8, (128, 1), 127.0),
    "int4": Scheme("int4", jnp.int4, (32, 1), 7.0),
}
# What `engine.weights_quant` accepts: 'none' keeps the run's dtype.
WEIGHT_QUANT_CHOICES = ("none", *SCHEMES)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WeightQuant:
  """A weight [..., K, N] held quantised: values [..., K, N], scales [..., K/bk, N/bn]."""
  values: jax.Array
  scales: jax.Array
  scheme: str = dataclasses.field(metadata=dict(static=True))
  block: tuple[int, int] = dataclasses.field(metadata=dict(static=True))

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.values.shape)

  @property
  def ndim(self) -> int:
    return len(self.values.shape)


def get_scheme(name: str) -> Scheme:
  if name not in SCHEMES:
    raise ValueError(f"Unknown weight quantisation {name!r}; choose one of "
                     f"{WEIGHT_QUANT_CHOICES} ('none' keeps the run's dtype).")
  return SCHEMES[name]


def block_of(scheme: Scheme, k: int, n: int, what: str = "weight") -> tuple[int, int]:
  """The scheme's block for a [K, N] matrix: each side the scheme's, or the whole
  dimension when it is smaller; a larger dimension must divide by it."""
  block = []
  for size, want, axis in ((k, scheme.block[0], "K (inputs)"),
                           (n, scheme.block[1], "N (outputs)")):
    side = min(size, want)
    if size % side:
      raise ValueError(f"{what}: {scheme.name} quantises blocks of {want} along {axis}, "
                       f"which has {size}; use a size divisible by {want} (or at most "
                       f"{want}), or weights_quant='none'.")
    block.append(side)
  return tuple(block)


def _blocked(x, bk, bn):
  """[..., K, N] as [..., K/bk, bk, N/bn, bn]."""
  *lead, k, n = x.shape
  return x.reshape(*lead, k // bk, bk, n // bn, bn)


def quantize_weight(w, scheme_name: str, what: str = "weight") -> WeightQuant:
  """`w` [..., K, N] (any float dtype) quantised by the scheme (float32 arithmetic)."""
  scheme = get_scheme(scheme_name)
  if w.ndim < 2:
    raise ValueError(f"{what}: weight quantisation needs a matrix [..., K, N]; got shape "
                     f"{tuple(w.shape)}.")
  bk, bn = block_of(scheme, w.shape[-2], w.shape[-1], what)
  blocks = _blocked(jnp.asarray(w, jnp.float32), bk, bn)
  amax = jnp.max(jnp.abs(blocks), axis=(-3, -1), keepdims=True)
  scale = jnp.where(amax > 0, amax / scheme.qmax, 1.0)
  scaled = blocks / scale
  if jnp.issubdtype(scheme.dtype, jnp.integer):
    scaled = jnp.clip(jnp.round(scaled), -scheme.qmax, scheme.qmax)
  values = scaled.astype(scheme.dtype).reshape(w.shape)
  return WeightQuant(values=values, scales=scale[..., 0, :, 0].astype(jnp.float32),
                     scheme=scheme.name, block=(bk, bn))


def dequantize_tile(values, scales, block: tuple[int, int], dtype):
  """values [..., k, n] times their scales [..., k/bk, n/bn] (float32), cast to `dtype`:
  the product the kernels form for one tile of a weight."""
  bk, bn = block
  blocks = _blocked(values.astype(jnp.float32), bk, bn)
  out = blocks * scales[..., :, None, :, None]
  return out.reshape(values.shape).astype(dtype)


def dequantize_weight(w: WeightQuant, dtype=jnp.float32):
  """The whole weight in `dtype`: references and tests (kernels never form it)."""
  return dequantize_tile(w.values, w.scales, w.block, dtype)


def is_quantized(x) -> bool:
  return isinstance(x, WeightQuant)


def value_bits(dtype) -> int:
  """Bits one value of `dtype` takes in device memory (int4: 4)."""
  dtype = jnp.dtype(dtype)
  if dtype in (jnp.dtype(jnp.int4), jnp.dtype(jnp.uint4)):
    return 4
  return dtype.itemsize * 8


def resident_bytes(shape, dtype) -> int:
  """Device bytes of an array of `shape` and `dtype` (int4 packed two to a byte)."""
  return -(-math.prod(shape) * value_bits(dtype) // 8)


def scale_shape(shape, block) -> tuple[int, ...]:
  """Scales' shape for a weight of `shape` in blocks `block`."""
  *lead, k, n = shape
  return (*lead, k // block[0], n // block[1])


def abstract_quantized(shape, scheme_name: str, sharding=None, scale_sharding=None,
                       what: str = "weight") -> WeightQuant:
  """ShapeDtypeStructs of quantize_weight(w) for w of `shape` (plans, templates)."""
  scheme = get_scheme(scheme_name)
  block = block_of(scheme, shape[-2], shape[-1], what)
  return WeightQuant(
      values=jax.ShapeDtypeStruct(tuple(shape), scheme.dtype, sharding=sharding),
      scales=jax.ShapeDtypeStruct(scale_shape(shape, block), np.float32,
                                  sharding=scale_sharding),
      scheme=scheme.name, block=block)
