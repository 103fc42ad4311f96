"""config.json `quantization_config` parsing (quant_schemes.py): the released families'
configs load, transformers' and compressed-tensors' spellings round-trip, and every
unsupported scheme is refused with an error naming the field."""

from __future__ import annotations

import json
import pathlib

import ml_dtypes
import numpy as np
import pytest

from c2jax.hf import quant_schemes, quantized
from c2jax.hf.config import HFConfigError

QUANT = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "quant"
CASES = ["deepseek_fp8", "deepseek_fp8_ue8m0", "kimi_int4"]
BF16 = np.dtype(ml_dtypes.bfloat16)


def _config(case: str) -> dict:
  return json.loads((QUANT / case / "config.json").read_text())


def _with(case: str, **changes) -> dict:
  config = _config(case)
  config["quantization_config"].update(changes)
  return config


def _weights(case: str, **changes) -> dict:
  config = _config(case)
  config["quantization_config"]["config_groups"]["group_0"]["weights"].update(changes)
  return config


@pytest.mark.parametrize("config,field", [
    (_with("deepseek_fp8", quant_method="gptq"), "quantization_config.quant_method"),
    (_with("deepseek_fp8", fmt="e5m2"), "quantization_config.fmt"),
    (_with("deepseek_fp8", activation_scheme="static"),
     "quantization_config.activation_scheme"),
    (_with("deepseek_fp8", weight_block_size=None), "quantization_config.weight_block_size"),
    (_with("deepseek_fp8", scale_fmt="e4m3"), "quantization_config.scale_fmt"),
    (_with("deepseek_fp8", group_size=32), "quantization_config.group_size"),
    (_with("deepseek_fp8", expert_dtype="fp4"), "quantization_config.expert_dtype"),
    (_with("kimi_int4", format="int-quantized"), "quantization_config.format"),
    (_with("kimi_int4", quantization_status="frozen"),
     "quantization_config.quantization_status"),
    (_weights("kimi_int4", symmetric=False),
     "quantization_config.config_groups.group_0.weights.symmetric"),
    (_weights("kimi_int4", type="float"),
     "quantization_config.config_groups.group_0.weights.type"),
    (_weights("kimi_int4", strategy="tensor"),
     "quantization_config.config_groups.group_0.weights.strategy"),
    (_weights("kimi_int4", actorder="group"),
     "quantization_config.config_groups.group_0.weights.actorder"),
])
def test_unsupported_schemes_are_refused(config, field):
  with pytest.raises(HFConfigError) as error:
    quantized.scheme_from_config(config)
  assert error.value.field == field


def test_config_round_trips_through_export():
  for case in CASES:
    scheme = quantized.scheme_from_config(_config(case))
    again = quantized.scheme_from_config({"quantization_config": scheme.hf_config()})
    assert again == scheme
  # The INT4 export config is what compressed-tensors wrote for Kimi (fixture), key for key.
  written = quantized.export_scheme("int4").hf_config()
  assert set(written) <= set(_config("kimi_int4")["quantization_config"])


def test_export_refuses_groups_that_do_not_divide(tmp_path):
  with pytest.raises(ValueError, match=r"'model\.layers\.1\.mlp\.experts\.0\.down_proj"
                     r"\.weight' \[32, 16\] to groups of 32"):
    quantized.quantize_for_export("model.layers.1.mlp.experts.0.down_proj.weight",
                                  np.ones((32, 16), BF16), "int4")
  with pytest.raises(ValueError, match="unknown quantisation 'int3'"):
    quantized.export_scheme("int3")


def test_transformers_fp8_config_keys_and_kimi_k25_nesting():
  """FineGrainedFP8Config.to_dict() keys load; Kimi-K2.5 keeps its config at the top."""
  config = _with("deepseek_fp8", dequantize=False, modules_to_convert=None, scale_fmt="float",
                 expert_dtype="fp8", modules_to_not_convert=["mlp.gate"])
  scheme = quantized.scheme_from_config(config)
  assert scheme == quant_schemes.Fp8Block(ignore=("mlp.gate",))
  assert not scheme.quantizes("model.layers.1.mlp.gate") and scheme.quantizes(
      "model.layers.1.mlp.gate_proj")
  k25 = {"model_type": "kimi_k25", "quantization_config": _config("kimi_int4")[
      "quantization_config"], "text_config": {"model_type": "kimi_k2", "dtype": "bfloat16"}}
  scheme = quantized.scheme_from_config(k25)
  assert scheme.quantizes("language_model.model.layers.1.mlp.experts.3.down_proj")
  assert not scheme.quantizes("language_model.model.layers.1.self_attn.q_a_proj")
  assert not scheme.quantizes("language_model.model.layers.0.mlp.down_proj")  # dense MLP
  stripped = quantized.without_quantization(k25)
  assert "quantization_config" not in stripped and stripped["text_config"] == k25[
      "text_config"]
  assert quantized.declared_dtype(k25) == BF16
