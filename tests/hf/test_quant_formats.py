"""The arithmetic of the released formats (quant_formats.py): int32 packing against
compressed-tensors' own, bit layout, FP8 power-of-two scales. Checkpoint-level tests are in
test_hf_quantized.py."""

from __future__ import annotations

import pathlib

import ml_dtypes
import numpy as np
import pytest

from c2jax.hf import quant_formats as qf
from c2jax.hf import quantized, safetensors_io

QUANT = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "quant"
BF16 = np.dtype(ml_dtypes.bfloat16)


def _bytes_equal(a: np.ndarray, b: np.ndarray) -> bool:
  return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_int4_packing_layout():
  """Eight 4-bit fields per int32, element 0 in the lowest nibble, stored as q + 8."""
  q = np.arange(-8, 8, dtype=np.int8).reshape(2, 8)
  packed = qf.pack_int32(q, 4)
  assert packed.dtype == np.int32 and packed.shape == (2, 1)
  assert packed.view(np.uint32)[:, 0].tolist() == [0x76543210, 0xFEDCBA98]
  ragged = qf.pack_int32(np.full((1, 9), 7, np.int8), 4)  # 9 values: 2 words, zero-padded
  assert ragged.view(np.uint32).tolist() == [[0xFFFFFFFF, 0x0000000F]]


@pytest.mark.parametrize("bits", range(1, 9))
def test_packing_equals_compressed_tensors(bits):
  infos = {i.name: i for i in safetensors_io._read_header(
      QUANT / "reference" / "packing.safetensors")}
  tables = quantized._read_many(list(infos.values()))
  q, packed = tables[f"q.{bits}"], tables[f"packed.{bits}"]
  assert _bytes_equal(qf.pack_int32(q, bits), packed)
  assert _bytes_equal(qf.unpack_int32(packed, bits, q.shape[1]), q)


@pytest.mark.parametrize("bits", range(1, 9))
def test_pack_unpack_all_widths(bits):
  rng = np.random.default_rng(bits)
  lo, hi = qf.int_qrange(bits)
  q = rng.integers(lo, hi, endpoint=True, size=(3, 45)).astype(np.int8)
  packed = qf.pack_int32(q, bits)
  assert packed.shape == (3, -(-45 * bits // 32))
  np.testing.assert_array_equal(qf.unpack_int32(packed, bits, 45), q)
  # Dense packing: the bit stream of a row is the fields back to back, low bit first.
  stream = np.unpackbits(packed.view(np.uint8), axis=-1, bitorder="little")
  first = sum(int(b) << i for i, b in enumerate(stream[0, bits:2 * bits]))
  assert first == q[0, 1] - lo


def test_fp8_power_of_two_scales_and_value_round_trip():
  rng = np.random.default_rng(0)
  w = (rng.normal(size=(200, 70)) * np.logspace(-4, 1, 70)).astype(BF16)
  q, scale = qf.fp8_quantize(w, (128, 128), power_of_two=True)
  assert scale.shape == (2, 1) and np.all(np.log2(scale) == np.round(np.log2(scale)))
  once = qf.fp8_dequantize(q, scale, (128, 128), BF16)
  again = qf.fp8_dequantize(*qf.fp8_quantize(once, (128, 128), True), (128, 128), BF16)
  assert _bytes_equal(once, again)  # dequantised values are fixed points
  assert np.abs(once.astype(np.float32) - w.astype(np.float32)).max() <= (
      np.abs(w.astype(np.float32)).max() / 8)
