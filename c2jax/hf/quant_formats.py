"""The arithmetic of released quantised weight formats, in numpy, one tensor at a time.

Two formats, each a pair of pure functions `dequantize(stored..., dtype) -> array` and
`quantize(array, ...) -> stored...`, bit-compatible with the code that wrote the released
checkpoints (tests/hf/test_quantized.py compares against fixtures made by the reference
libraries; tools/fixtures/make_quant_fixtures.py):

  FP8 blocks (DeepSeek-V3/V3.1, Kimi-K2): `weight` float8_e4m3fn [out, in] and
    `weight_scale_inv` float32 [ceil(out/bo), ceil(in/bi)], one scale per bo x bi block
    (the last row/column of blocks is ragged when a dim is not a multiple of the block).
    w = float32(q) * s, then cast. Quantising takes s = max(amax, 1e-4) / 448 per block
    (rounded up to a power of two for `scale_fmt: ue8m0`, DeepSeek-V3.1) and
    q = e4m3(clamp(w / s, +-448)), as DeepSeek's kernels do.
  Packed ints (compressed-tensors `pack-quantized`, Kimi-K2-Thinking/K2.5 experts):
    signed b-bit values q in [-2^(b-1), 2^(b-1)) per group of g input columns, stored
    offset by 2^(b-1) as unsigned fields packed densely little-endian into int32 words
    along the input dim (element j of a row occupies bits [j*b, j*b + b) of the row's bit
    stream; 4-bit: eight nibbles per word, low nibble first), zero-padded to whole words;
    `weight_scale` [out, ceil(in/g)] in the model dtype; `weight_shape` int [2].
    w = q * s computed in the scale's dtype. Quantising mirrors compressed-tensors'
    symmetric min-max observer: s = amax / ((2^b - 1) / 2) in the weight dtype (zero
    groups get the dtype's eps), q = clamp(round_half_even(w / s)).

Round trips: quantize(dequantize(t)) reproduces t's bytes when the dequantized values
determine the scales. FP8 with float32 scales: a block's largest |q| is 448, so its
amax gives s back whenever the dequantised amax is exact (checkpoints quantised from
bf16 weights and loaded in bf16 or float32). FP8 ue8m0: the dequantised values are
fixed points (re-export decodes to the same weights), but q = 448 at scale s and q = 224
at 2s decode alike, so those blocks may come back in the other form. Packed ints:
`quantize` first looks for a scale whose dequantisation reproduces the group exactly
(the group came from this format) and uses the min-max formula only for groups that
have none, so a released checkpoint loaded in its own dtype and exported again is
byte-identical.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
FP8_MAX = 448.0
FP8_MIN_AMAX = 1e-4  # DeepSeek's kernels clamp a block's amax so all-zero blocks get s > 0


def _blocks(n: int, block: int) -> int:
  return -(-n // block)


def _expand(scale: np.ndarray, shape: tuple[int, int], block: tuple[int, int]
            ) -> np.ndarray:
  """Per-block scales [ceil(r/br), ceil(c/bc)] -> per-element [r, c] (ragged edges cut)."""
  return np.repeat(np.repeat(scale, block[0], axis=0), block[1], axis=1)[:shape[0], :shape[1]]


def fp8_scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
  return (_blocks(shape[0], block[0]), _blocks(shape[1], block[1]))


# float8_e4m3fn byte -> float32 value.
_FP8_TO_F32 = np.arange(256, dtype=np.uint8).view(FP8).astype(np.float32)


def fp8_dequantize(q: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int],
                   dtype) -> np.ndarray:
  """float32(q) * s per block, cast to dtype (round to nearest even), as DeepSeek does.

  A block has one scale and q has 256 codes, so each row of blocks builds the table of
  all dtype(code * s) and looks its bytes up: the same values as multiplying element by
  element, ~4x faster and without float32 temporaries.
  """
  rows, cols = q.shape
  out = np.empty(q.shape, dtype)
  codes = q.view(np.uint8)
  table_base = (np.arange(cols, dtype=np.int32) // block[1]) * 256  # column block's table
  for i, scales in enumerate(scale_inv.astype(np.float32)):
    table = (scales[:, None] * _FP8_TO_F32[None, :]).astype(dtype).reshape(-1)
    band = slice(i * block[0], (i + 1) * block[0])
    np.take(table, codes[band] + table_base, out=out[band])
  return out


def fp8_quantize(w: np.ndarray, block: tuple[int, int], power_of_two: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
  """(q float8_e4m3fn [out, in], scale_inv float32 per block) of a 2-D weight."""
  rows, cols = w.shape
  br, bc = block
  pr, pc = _blocks(rows, br) * br, _blocks(cols, bc) * bc
  w32 = w.astype(np.float32)
  padded = np.zeros((pr, pc), np.float32)  # zeros never raise a block's amax
  padded[:rows, :cols] = np.abs(w32)
  amax = padded.reshape(pr // br, br, pc // bc, bc).max(axis=(1, 3))
  scale = np.maximum(amax, np.float32(FP8_MIN_AMAX)) / np.float32(FP8_MAX)
  if power_of_two:  # ue8m0: round the scale up so every |w / s| stays <= 448
    scale = np.exp2(np.ceil(np.log2(scale))).astype(np.float32)
  scaled = np.clip(w32 / _expand(scale, w.shape, block), -FP8_MAX, FP8_MAX)
  return scaled.astype(FP8), scale.astype(np.float32)


def int_qrange(bits: int) -> tuple[int, int]:
  return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def packed_words(cols: int, bits: int) -> int:
  return _blocks(cols * bits, 32)


def pack_int32(q: np.ndarray, bits: int) -> np.ndarray:
  """Signed b-bit ints [rows, cols] -> int32 [rows, ceil(cols*b/32)], dense little-endian."""
  rows, cols = q.shape
  fields = (q.astype(np.int16) + (1 << (bits - 1))).astype(np.uint8)
  words = packed_words(cols, bits)
  if bits == 4:  # two nibbles per byte, low nibble first; four bytes per little-endian word
    nibbles = np.zeros((rows, words * 8), np.uint8)
    nibbles[:, :cols] = fields
    packed = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)
    return packed.view("<i4").reshape(rows, words).astype(np.int32)
  field_bits = np.unpackbits(fields[..., None], axis=-1, count=bits, bitorder="little")
  stream = np.zeros((rows, words * 32), np.uint8)
  stream[:, :cols * bits] = field_bits.reshape(rows, cols * bits)
  packed = np.packbits(stream, axis=-1, bitorder="little")
  return packed.view("<i4").reshape(rows, words).astype(np.int32)


def unpack_int32(packed: np.ndarray, bits: int, cols: int) -> np.ndarray:
  """Inverse of pack_int32: int32 [rows, words] -> int8 [rows, cols] in the signed range."""
  rows = packed.shape[0]
  raw = np.ascontiguousarray(packed.astype("<i4")).view(np.uint8).reshape(rows, -1)
  if bits == 4:
    fields = np.empty((rows, raw.shape[1] * 2), np.uint8)
    fields[:, 0::2] = raw & 0xF
    fields[:, 1::2] = raw >> 4
    fields = fields[:, :cols]
  else:
    stream = np.unpackbits(raw, axis=-1, bitorder="little")[:, :cols * bits]
    weights = (1 << np.arange(bits, dtype=np.uint16)).astype(np.uint16)
    fields = (stream.reshape(rows, cols, bits) * weights).sum(-1).astype(np.uint8)
  return (fields.astype(np.int16) - (1 << (bits - 1))).astype(np.int8)


def int_dequantize(q: np.ndarray, scale: np.ndarray, group: int, dtype) -> np.ndarray:
  """q * s in the scale's dtype (exact in float32, then rounded once), cast to dtype."""
  rows, cols = q.shape
  groups = scale.shape[1]
  if cols == groups * group:
    product = q.astype(np.float32).reshape(rows, groups, group)
  else:  # a ragged last group: pad it
    product = np.zeros((rows, groups * group), np.float32)
    product[:, :cols] = q
    product = product.reshape(rows, groups, group)
  product *= scale.astype(np.float32)[..., None]
  product = product.reshape(rows, -1)[:, :cols].astype(scale.dtype)
  return product.astype(dtype, copy=False)


def _eps(dtype: np.dtype) -> np.floating:
  return ml_dtypes.finfo(dtype).eps if dtype == ml_dtypes.bfloat16 else np.finfo(dtype).eps


def _grouped(w32: np.ndarray, group: int) -> np.ndarray:
  rows, cols = w32.shape
  if cols % group:  # compressed-tensors refuses these too: no reader could load them
    raise ValueError(f"{cols} input columns are not a multiple of the group size {group}.")
  return w32.reshape(rows, cols // group, group)


def _round_to(x32: np.ndarray, dtype: np.dtype) -> np.ndarray:
  """float32 values rounded (nearest even) to dtype, kept as float32, in place for bf16
  (bit arithmetic: ~4x faster than casting to bfloat16 and back)."""
  if dtype == np.float32:
    return x32
  if dtype != ml_dtypes.bfloat16:
    return x32.astype(dtype).astype(np.float32)
  bits = x32.view(np.uint32)
  carry = bits >> np.uint32(16)  # in-place steps: one temporary for the whole rounding
  carry &= np.uint32(1)
  carry += np.uint32(0x7FFF)
  bits += carry
  bits &= np.uint32(0xFFFF0000)
  return x32


def _quantize_groups(wg32: np.ndarray, scale: np.ndarray, dtype: np.dtype, bits: int
                     ) -> np.ndarray:
  """round_half_even(clamp(w / s)), the division rounded to `dtype` as torch does."""
  lo, hi = int_qrange(bits)
  ratio = _round_to(wg32 / scale.astype(np.float32)[..., None], dtype)
  np.clip(ratio, lo, hi, out=ratio)
  return np.rint(ratio, out=ratio).astype(np.int8)


def _exact(q: np.ndarray, scale: np.ndarray, wg32: np.ndarray, dtype: np.dtype
           ) -> np.ndarray:
  """Per group: does dequantising (q, scale) in dtype give back exactly wg32?"""
  values = _round_to(q.astype(np.float32) * scale.astype(np.float32)[..., None], dtype)
  return np.all(values == wg32, axis=-1)


def int_quantize(w: np.ndarray, bits: int, group: int, dtype
                 ) -> tuple[np.ndarray, np.ndarray]:
  """(q int8 [rows, cols], scale [rows, cols/g] in dtype) of a 2-D weight held in dtype."""
  dtype = np.dtype(dtype)
  wg32 = _grouped(w.astype(dtype).astype(np.float32), group)
  lo, hi = int_qrange(bits)
  lows, highs = wg32.min(-1), wg32.max(-1)
  amax = np.maximum(-lows, highs).clip(min=0)
  formula = (amax / np.float32((hi - lo) / 2)).astype(dtype)
  formula = np.where(formula == 0, _eps(dtype), formula).astype(dtype)
  best_scale, best_q = formula, _quantize_groups(wg32, formula, dtype, bits)
  settled = _exact(best_q, formula, wg32, dtype)
  # A group written by this format has its extreme at q = hi or q = lo, so its scale is
  # amax / hi or amax / -lo up to one rounding of the product: try those and their
  # neighbours in the scale dtype, the one the extreme's sign suggests first. Only a
  # group with at most 2^bits distinct values can be exact; each candidate is tried on
  # the groups still open (most settle on the first).
  distinct = 1 + np.count_nonzero(np.diff(np.sort(wg32, axis=-1), axis=-1), axis=-1)
  todo = np.nonzero(~settled & (distinct <= (1 << bits)))
  negative = -lows > highs
  by_hi, by_lo = ((amax / np.float32(d)).astype(dtype) for d in (hi, -lo))
  first = np.where(negative, by_lo, by_hi)
  second = np.where(negative, by_hi, by_lo)
  for candidate in (first, second, _step(first, +1), _step(first, -1), _step(second, +1),
                    _step(second, -1)):
    if not todo[0].size:
      break
    scale = candidate[todo]
    scale = np.where(scale > 0, scale, formula[todo]).astype(dtype)
    q = _quantize_groups(wg32[todo], scale, dtype, bits)
    exact = _exact(q, scale, wg32[todo], dtype)
    hit = tuple(axis[exact] for axis in todo)
    best_scale[hit], best_q[hit] = scale[exact], q[exact]
    todo = tuple(axis[~exact] for axis in todo)
  return best_q.reshape(w.shape), best_scale


def _step(values: np.ndarray, direction: int) -> np.ndarray:
  """The adjacent representable value of non-negative floats: up (+1) or down (-1)."""
  if values.dtype == np.float32:
    return np.nextafter(values, np.float32(np.inf if direction > 0 else 0)).astype(np.float32)
  top = {np.dtype(np.float16): 0x7BFF}.get(values.dtype, 0x7F7F)  # largest finite bits
  bits = np.clip(values.view(np.uint16).astype(np.int32) + direction, 0, top)
  return bits.astype(np.uint16).view(values.dtype)
