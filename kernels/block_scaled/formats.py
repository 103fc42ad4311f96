"""Block-scaled low-precision formats: quantize / dequantize and the QuantizedArray pytree.

Legend: L length of the quantised axis (padded with zeros to Lp, a multiple of the block
size B), NB = Lp / B blocks; "..." are all other axes. A QuantizedArray stores its
quantised axis LAST (values [..., Lp], scales [..., NB]), the layout block-scaled GEMMs
contract over; `dequantize` restores the original layout.

Formats (FORMATS):
  mxfp8_e4m3 / mxfp8_e5m2: OCP MX values (max 448 / 57344), one E8M0 power-of-two scale
    per 32 elements. The scale is rounded UP: 2^ceil(log2(amax / max)), the smallest
    power of two for which no element saturates.
  nvfp4: E2M1 values (max 6), one E4M3 scale per 16 elements and an FP32 per-token scale
    per slice along the quantised axis (token_scale = amax / (6 * 448), so the largest block
    scale lands on E4M3's max). Block scales are rounded up to the next E4M3 value; the
    quotient can then exceed 6 only by float32 rounding, and is clipped to 6.

Edge cases (tested):
  - zeros quantise to zeros; an all-zero block gets a finite scale.
  - float32 subnormal inputs are flushed to zero by XLA (CPU and GPU), so they quantise to
    zero; FP8/FP4 subnormal code points are used and round-trip exactly.
  - scale exponents are clamped to [-126, 126] so every scale and its inverse are normal
    float32 numbers (2^126 * 448 already exceeds float32's range).
  - values within one FP8 step of float32's max (e.g. float32 max itself) round to the
    grid point 2^128 and dequantise to +-inf; everything below 2^127 * 1.75 is finite.
  - NaN or +-inf anywhere in a block makes that block's scale NaN: the whole block
    dequantises to NaN (the OCP MX rule) and other blocks are unaffected. Infinities are
    not kept (E4M3 and E2M1 have none).
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

# Both 2^e and 2^-e must be normal float32 (XLA flushes subnormals). Inputs below
# 2^128 never need e > 126 with E4M3/E5M2 maxima, so E8M0's 127 is never lost.
_MIN_SCALE_EXP, _MAX_SCALE_EXP = -126, 126


@dataclasses.dataclass(frozen=True)
class BlockFormat:
  name: str
  value_dtype: Any
  scale_dtype: Any
  block_size: int
  value_max: float
  per_token_scale: bool


FORMATS = {
    'mxfp8_e4m3': BlockFormat('mxfp8_e4m3', jnp.float8_e4m3fn, jnp.float8_e8m0fnu, 32,
                              448.0, per_token_scale=False),
    'mxfp8_e5m2': BlockFormat('mxfp8_e5m2', jnp.float8_e5m2, jnp.float8_e8m0fnu, 32,
                              57344.0, per_token_scale=False),
    'nvfp4': BlockFormat('nvfp4', jnp.float4_e2m1fn, jnp.float8_e4m3fn, 16, 6.0,
                         per_token_scale=True),
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedArray:
  """A block-quantised array; the quantised axis is stored last (see module docstring)."""
  values: jax.Array  # [..., Lp] in fmt.value_dtype
  scales: jax.Array  # [..., NB] in fmt.scale_dtype
  token_scales: jax.Array | None  # [..., 1] float32 (nvfp4) or None
  fmt: str = dataclasses.field(metadata=dict(static=True))
  axis: int = dataclasses.field(metadata=dict(static=True))  # in the original layout
  length: int = dataclasses.field(metadata=dict(static=True))  # L before padding
  dtype: Any = dataclasses.field(metadata=dict(static=True))  # original dtype


def get_format(fmt):
  if fmt not in FORMATS:
    raise ValueError(f"Unknown block-scaled format {fmt!r}; choose one of {sorted(FORMATS)}.")
  return FORMATS[fmt]


def _pow2(exponent):
  """Exactly 2^exponent for integer-valued float32 exponents in [-126, 127]; XLA's exp2
  is a polynomial approximation and is not exact at integers."""
  biased = (exponent.astype(jnp.int32) + 127) << 23
  return jax.lax.bitcast_convert_type(biased, jnp.float32)


def _ceil_log2_scale(amax, value_max):
  """Smallest exponent e with amax * 2^-e <= value_max, computed exactly."""
  mantissa, exponent = jnp.frexp(amax / value_max)
  e = jnp.where(mantissa == 0.5, exponent - 1, exponent).astype(jnp.float32)
  # The ratio is rounded (XLA may even multiply by a rounded 1/value_max), so the guess can
  # be one off either way near a power of two; the checks below are exact (powers of two).
  fits = lambda exp: amax * _pow2(-jnp.clip(exp, -126, 127)) <= value_max
  e = jnp.where(fits(e - 1), e - 1, e)
  e = jnp.where(fits(e), e, e + 1)
  return jnp.clip(e, _MIN_SCALE_EXP, _MAX_SCALE_EXP)


def _keep_rounded(values):
  """`values` (just cast to a narrow float type) behind an optimisation barrier.

  XLA's GPU compiler removes a round trip of converts through a narrower float type
  (wide -> fp8 -> wide) when excess precision is allowed, its default: without the
  barrier, quantize-then-dequantize in one jitted function returned the unquantised
  values on an H200 (the 'dequantize' paths computed in bf16, not MXFP8). The TPU and
  CPU compilers keep the round trip; the barrier costs them nothing.
  """
  return jax.lax.optimization_barrier(values)


def _round_up_e4m3(x):
  """Smallest E4M3 value >= x, for 0 <= x <= 448."""
  nearest = _keep_rounded(x.astype(jnp.float8_e4m3fn))
  bits = jax.lax.bitcast_convert_type(nearest, jnp.uint8)
  above = jax.lax.bitcast_convert_type(bits + jnp.uint8(1), jnp.float8_e4m3fn)
  return jnp.where(nearest.astype(jnp.float32) < x, above, nearest)


def quantize(x, fmt, axis=-1):
  """Quantise `x` in blocks along `axis` into a QuantizedArray of format `fmt`."""
  spec = get_format(fmt)
  axis = axis % x.ndim
  x_LAST = jnp.moveaxis(x, axis, -1).astype(jnp.float32)
  length = x_LAST.shape[-1]
  pad = -length % spec.block_size
  x_LAST = jnp.pad(x_LAST, [(0, 0)] * (x_LAST.ndim - 1) + [(0, pad)])
  blocks = x_LAST.reshape(*x_LAST.shape[:-1], -1, spec.block_size)  # [..., NB, B]

  finite = jnp.isfinite(blocks)
  abs_blocks = jnp.where(finite, jnp.abs(blocks), 0.0)
  amax_NB = jnp.max(abs_blocks, axis=-1)
  bad_NB = ~jnp.all(finite, axis=-1)
  safe_blocks = jnp.where(finite, blocks, 0.0)

  if spec.per_token_scale:
    amax_token = jnp.max(amax_NB, axis=-1, keepdims=True)
    token_scales = jnp.where(amax_token > 0, amax_token / (spec.value_max * 448.0), 1.0)
    wanted = jnp.minimum(amax_NB / (spec.value_max * token_scales), 448.0)
    block_scales = _round_up_e4m3(wanted)
    divisor = (block_scales.astype(jnp.float32) * token_scales)[..., None]
    scaled = jnp.where(divisor > 0, safe_blocks / jnp.where(divisor > 0, divisor, 1.0), 0.0)
    scaled = jnp.clip(scaled, -spec.value_max, spec.value_max)
    block_scales = jnp.where(bad_NB, jnp.nan, block_scales.astype(jnp.float32))
  else:
    token_scales = None
    exponent_NB = _ceil_log2_scale(amax_NB, spec.value_max)
    scaled = safe_blocks * _pow2(-exponent_NB)[..., None]
    block_scales = jnp.where(bad_NB, jnp.nan, _pow2(exponent_NB))

  values = _keep_rounded(scaled.astype(spec.value_dtype)).reshape(x_LAST.shape)
  return QuantizedArray(values=values, scales=block_scales.astype(spec.scale_dtype),
                        token_scales=token_scales, fmt=fmt, axis=axis, length=length,
                        dtype=jnp.dtype(x.dtype))


def dequantize_padded(q):
  """float32 [..., Lp] in the stored (quantised-axis-last, zero-padded) layout."""
  spec = get_format(q.fmt)
  blocks = q.values.astype(jnp.float32).reshape(*q.scales.shape, spec.block_size)
  scale = q.scales.astype(jnp.float32)
  if q.token_scales is not None:
    scale = scale * q.token_scales
  return (blocks * scale[..., None]).reshape(q.values.shape)


def dequantize(q, dtype=None):
  """The array `q` approximates, in its original layout and dtype (or `dtype`)."""
  x_LAST = dequantize_padded(q)[..., :q.length]
  return jnp.moveaxis(x_LAST, -1, q.axis).astype(dtype or q.dtype)
