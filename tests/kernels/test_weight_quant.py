"""Weight-only quantised weights: formats against hand-derived values, the grouped matmul
against the dequantised weights through the unquantised reference (the TPU kernel in
Pallas' TPU interpreter, on compile-only v5p devices)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax_kernels import weight_quant as wq
from c2jax_kernels.grouped_matmul import reference


def test_int4_groups_of_32_hand_values():
  # One column, K = 64: two groups of 32. Group 0 max |x| 3.5 -> scale 0.5; group 1 is 0.
  w = np.zeros((64, 1), np.float32)
  w[:32, 0] = np.linspace(-3.5, 3.5, 32)
  q = wq.quantize_weight(w, "int4")
  assert q.values.dtype == jnp.int4 and q.block == (32, 1)
  np.testing.assert_array_equal(np.asarray(q.scales), [[0.5], [1.0]])
  np.testing.assert_array_equal(np.asarray(q.values[:32, 0], np.int32),
                                np.round(np.linspace(-7, 7, 32)).astype(np.int32))
  np.testing.assert_array_equal(np.asarray(q.values[32:], np.int32), 0)


def test_fp8_block_is_128_by_128_and_clips_to_small_dims():
  x = jax.random.normal(jax.random.key(0), (2, 256, 384), jnp.float32)
  q = wq.quantize_weight(x, "fp8")
  assert q.values.dtype == jnp.float8_e4m3fn and q.scales.shape == (2, 2, 3)
  # Each block's largest magnitude lands on 448 exactly.
  blocks = np.abs(np.asarray(q.values, np.float32)).reshape(2, 2, 128, 3, 128)
  np.testing.assert_array_equal(blocks.max(axis=(2, 4)), 448.0)
  small = wq.quantize_weight(x[:, :64, :48], "fp8")
  assert small.block == (64, 48) and small.scales.shape == (2, 1, 1)
  with pytest.raises(ValueError, match="blocks of 128 along K"):
    wq.quantize_weight(x[:, :200], "fp8", what="experts/gate_proj")
  with pytest.raises(ValueError, match="choose one of"):
    wq.quantize_weight(x, "fp6")


@pytest.mark.parametrize("scheme,tol", [("fp8", 0.07), ("int8", 0.01), ("int4", 0.2)])
def test_dequantised_error_is_within_the_format(scheme, tol):
  x = jax.random.normal(jax.random.key(1), (3, 256, 64), jnp.float32)
  q = wq.quantize_weight(x, scheme)
  err = np.abs(np.asarray(wq.dequantize_weight(q)) - np.asarray(x))
  # Relative to each block's largest magnitude (fp8: 3 mantissa bits, int: half a step).
  assert err.max() / np.abs(np.asarray(x)).max() < tol
  assert wq.resident_bytes(q.values.shape, q.values.dtype) == x.size * {
      "fp8": 1, "int8": 1, "int4": 0.5}[scheme]


# 'tokamax' (a TPU kernel) runs in Pallas' TPU interpreter:
# test_tokamax_quantised_grouped_matmul_in_tpu_interpret_mode below.
@pytest.mark.parametrize("impl", sorted(set(wq.IMPLS) - {"tokamax"}))
@pytest.mark.parametrize("scheme", sorted(wq.SCHEMES))
def test_grouped_matmul_matches_dequantised_reference(impl, scheme):
  g, k, n = 4, 512, 128
  keys = jax.random.split(jax.random.key(2), 2)
  w = wq.quantize_weight(jax.random.normal(keys[0], (g, k, n), jnp.float32), scheme)
  lhs = jax.random.normal(keys[1], (40, k), jnp.float32)
  sizes = jnp.array([9, 0, 25, 3], jnp.int32)  # 37 of 40 rows: the last 3 are zero
  got = jax.jit(lambda a, b, s: wq.quantized_grouped_matmul(a, b, s, impl=impl))(lhs, w, sizes)
  want = reference.gmm(lhs, wq.dequantize_weight(w), sizes, transpose_rhs=False,
                       out_dtype=jnp.float32)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-4)
  np.testing.assert_array_equal(np.asarray(got[37:]), 0)


def test_grouped_matmul_never_forms_the_whole_dequantised_weight():
  # 8 experts of 1024 x 256 int8: the whole weight in float32 is 8 MiB; the CPU path
  # dequantises one expert's K-chunk (256 x 256 x 4 B = 256 KiB) at a time.
  g, k, n = 8, 1024, 256
  w = wq.abstract_quantized((g, k, n), "int8")
  lhs = jax.ShapeDtypeStruct((16, k), jnp.float32)
  sizes = jax.ShapeDtypeStruct((g,), jnp.int32)
  for impl, bound in (("tiled", 1 << 20), ("slabs", 4 << 20)):
    compiled = jax.jit(lambda a, b, s: wq.quantized_grouped_matmul(a, b, s, impl=impl)
                       ).lower(lhs, w, sizes).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    assert temp < bound, (impl, temp)


def test_bad_operands_are_named():
  w = wq.quantize_weight(jnp.ones((2, 64, 32)), "int8")
  with pytest.raises(ValueError, match="does not contract"):
    wq.quantized_grouped_matmul(jnp.ones((4, 32)), w, jnp.array([2, 2]))
  with pytest.raises(ValueError, match="WeightQuant"):
    wq.quantized_grouped_matmul(jnp.ones((4, 64)), jnp.ones((2, 64, 32)), jnp.array([2, 2]))


@pytest.mark.parametrize("dtype,scale_rtol", [(np.float32, 2**-23), (jnp.bfloat16, 2**-8)])
def test_fp8_of_a_released_deepseek_checkpoint_keeps_its_values(dtype, scale_rtol):
  """An engine holding a DeepSeek-V3 FP8 release as `weights_quant='fp8'` quantises the
  weights the loader dequantised (in the run's dtype) again: each 128 x 128 block's
  largest value was 448 x its scale, so the float8 values come back as stored and each
  scale within the run dtype's rounding of that largest value (one float32 ulp; 2^-8 in
  bfloat16), not bit for bit (the fixture was written by DeepSeek's reference code,
  tests/fixtures/quant). (Kimi-K2.5's int4 release does not round-trip: its groups'
  scales are amax / 7.5 with values down to -8, the engine's amax / 7.)"""
  import json  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top

  from c2jax.hf import quant_formats, quantized, safetensors_io  # pylint: disable=g-import-not-at-top

  case = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "quant" / "deepseek_fp8"
  _, reader = quantized.open_hf(case, json.loads((case / "config.json").read_text()),
                                dtype=np.dtype(dtype))
  stored = safetensors_io.SafetensorsReader(case)
  released = {n.removesuffix(".weight"): (reader.read(n), stored.read(n),
                                          stored.read(n + "_scale_inv"))
              for n in reader.names() if ".experts." in n and reader.is_quantized(n)}
  assert released
  # And several blocks (384 x 256, [out, in] as DeepSeek stores them), written by
  # hf.quant_formats.fp8_quantize (bit-compatible with DeepSeek's code, tests/hf).
  w = np.random.default_rng(0).standard_normal((384, 256)).astype(np.float32)
  q, scale = quant_formats.fp8_quantize(w, (128, 128))
  released["blocks"] = (quant_formats.fp8_dequantize(q, scale, (128, 128), np.dtype(dtype)),
                        q, scale)
  for name, (dequantized, values, scales) in released.items():
    held = wq.quantize_weight(jnp.asarray(dequantized).T, "fp8")  # [in, out]
    np.testing.assert_array_equal(np.asarray(held.values).T.view(np.uint8),
                                  values.view(np.uint8), err_msg=name)
    np.testing.assert_allclose(np.asarray(held.scales).T, scales, rtol=scale_rtol, atol=0,
                               err_msg=name)


@pytest.mark.filterwarnings("ignore:Error reading persistent compilation cache entry")
def test_tokamax_quantised_grouped_matmul_in_tpu_interpret_mode():
  """Resident quantised experts on TPU (kernels/weight_quant, impl 'tokamax'): int4, int8
  and fp8 (128-column blocks) in Pallas' TPU interpreter against the dequantised
  reference, with an empty group, fewer rows than the kernel's 128 (padded) and rows past
  the routed sum (zero); the default picks it on TPU for K, N >= 128 per device and
  'slabs' below or where XLA partitions the call, and it compiles through Mosaic for v5p."""
  from jax.experimental.pallas import tpu as pltpu

  from c2jax.plan import topologies
  from c2jax_kernels import platform as kernel_platform
  from c2jax_kernels.weight_quant import grouped

  if not kernel_platform.library_installed():
    pytest.skip("tokamax: pip install -e '.[kernels]'")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # as c2jax plan --target does
  v5p_devices = topologies.parse_target("v5p-8").devices()  # compile-only (libtpu)
  mesh = jax.sharding.Mesh(np.asarray(v5p_devices[:1]), ("x",))
  keys = jax.random.split(jax.random.key(3), 2)
  lhs = jax.random.normal(keys[1], (40, 256), jnp.float32).astype(jnp.bfloat16)
  sizes = jnp.array([9, 0, 25, 3], jnp.int32)  # 37 of 40 rows
  for scheme in ("int4", "int8", "fp8"):
    w = wq.quantize_weight(jax.random.normal(keys[0], (4, 256, 128), jnp.float32), scheme)
    want = reference.gmm(lhs.astype(jnp.float32), wq.dequantize_weight(w), sizes,
                         transpose_rhs=False, out_dtype=jnp.float32)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), pltpu.force_tpu_interpret_mode():
      assert grouped.default_impl(k=256, n=128) == "tokamax"
      assert grouped.default_impl(k=64, n=128) == "slabs"
      got = wq.quantized_grouped_matmul(lhs, w, sizes, preferred_element_type=jnp.float32)
    np.testing.assert_allclose(np.asarray(got[:37]), np.asarray(want[:37]), rtol=1e-5,
                               atol=1e-4, err_msg=scheme)
    np.testing.assert_array_equal(np.asarray(got[37:]), 0)
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  args = (jax.ShapeDtypeStruct((40, 256), jnp.bfloat16, sharding=rep),
          wq.abstract_quantized((4, 256, 128), "int4", sharding=rep, scale_sharding=rep),
          jax.ShapeDtypeStruct((4,), jnp.int32, sharding=rep))
  with jax.set_mesh(mesh):
    compiled = jax.jit(wq.quantized_grouped_matmul).lower(*args).compile()
  assert 'custom_call_target="tpu_custom_call"' in compiled.as_text()
  # Weights sharded by XLA's partitioner (no shard_map), which cannot split a Mosaic call.
  four = jax.sharding.Mesh(np.asarray(v5p_devices[:4]), ("fsdp",))
  with jax.sharding.use_abstract_mesh(four.abstract_mesh):
    assert grouped.default_impl(k=256, n=128) == "slabs"
  with pytest.raises(ValueError, match="needs K and N of at least 128"):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      wq.quantized_grouped_matmul(lhs[:, :64], wq.quantize_weight(jnp.ones((4, 64, 128)),
                                                                  "int8"), sizes,
                                  impl="tokamax")
