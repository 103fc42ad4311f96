"""hf.load(weights_quant=): a released checkpoint's routed experts read as stored, for an
inference engine holding that format (the engine side: tests/rollout/test_engine_weights_quant.py)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from c2jax import hf
from c2jax.hf import quant_formats as qf
from c2jax.hf import safetensors_io
from c2jax.model import moe
from c2jax_kernels import weight_quant
from tests.hf.test_hf_quantized import BF16, INT4_G16, _all, _bytes_equal, _get, _leaves
from tests.model.conftest import MLA_OVERRIDES, random_params, tiny_cfg


@pytest.mark.parametrize("scheme", ["fp8", "int4", INT4_G16], ids=["fp8", "int4", "int4-g16"])
def test_experts_load_as_stored_for_an_engine_of_their_format(scheme, tmp_path):
  """hf.load(weights_quant=) gives the routed experts stored in the engine's format as
  WeightQuant leaves: the stored values and scales, transposed to [K, N], never
  dequantised; they dequantise to what hf.load gives. Everything else is as hf.load
  gives it. Groups of 16 are not the int4 engine's 32: dequantised, said in a log line."""
  # Experts [64, 32] and [32, 64] (the fixtures' 16 inputs take no group of 32).
  cfg = tiny_cfg(num_layers=2, **MLA_OVERRIDES)
  params = jax.tree.map(np.asarray, random_params(cfg))
  hf.save(cfg, params, tmp_path / "q", quantize=scheme)
  stored = _all(safetensors_io.SafetensorsReader(tmp_path / "q"))
  _, plain = hf.load(tmp_path / "q")
  engine_scheme = "fp8" if scheme == "fp8" else "int4"
  logs = []
  _, held = hf.load(tmp_path / "q", weights_quant=engine_scheme, log=logs.append)
  if scheme is INT4_G16:
    assert len(logs) == 1 and "stored blocks (16, 1), the engine's (32, 1)" in logs[0], logs
    for path, value in _leaves(plain):
      np.testing.assert_array_equal(_get(held, path), value, err_msg="/".join(path))
    return
  assert not logs
  experts = [path for path, _ in _leaves(plain) if moe.is_routed_expert(path)]
  assert experts
  for path, value in _leaves(plain):
    ours = _get(held, path)
    if path not in experts:
      np.testing.assert_array_equal(ours, value, err_msg="/".join(path))
      continue
    assert weight_quant.is_quantized(ours) and ours.scheme == engine_scheme, path
    as_bf16 = np.asarray(weight_quant.dequantize_weight(ours, jnp.bfloat16))
    np.testing.assert_array_equal(as_bf16, value.astype(BF16), err_msg="/".join(path))
  # The first MoE layer's expert 0's up projection, stored [out, in].
  up = _get(held, ("moe_layers", "moe", "experts", "up_proj"))
  module = f"model.layers.{cfg.first_k_dense}.mlp.experts.0.up_proj."
  if scheme == "fp8":
    values, scales = stored[module + "weight"], stored[module + "weight_scale_inv"]
    assert up.values.dtype == qf.FP8 and _bytes_equal(np.ascontiguousarray(up.values[0, 0].T),
                                                      values)
  else:  # Kimi-K2.5's: amax / 7.5, values -8..7, scales in bfloat16
    values = qf.unpack_int32(stored[module + "weight_packed"], 4, up.shape[-2])
    scales = stored[module + "weight_scale"]
    assert up.values.dtype == ml_dtypes.int4 and values.min() == -8
    np.testing.assert_array_equal(up.values[0, 0].T.astype(np.int8), values)
  np.testing.assert_array_equal(up.scales[0, 0].T, scales.astype(np.float32))
