"""Builds tests/fixtures/quant/<case>/ in the released on-disk layouts, with reference values.

Run with $C2JAX_TORCH_PYTHON (torch, transformers, compressed-tensors; not the project's venv):

  $C2JAX_TORCH_PYTHON tools/make_quant_fixtures.py [--out DIR]

With --out the same fixtures (same seeds) go to DIR instead; tests/hf/test_hf_quantized.py
does that live (when $C2JAX_TORCH_PYTHON names this venv) and checks the installed
reference libraries still write the committed bytes.

Each case directory holds what a released checkpoint holds for a few modules -- a
`config.json` whose `quantization_config` is the real one of that family, and
`model.safetensors` with the stored tensors under their real names -- plus
`reference/<case>.safetensors`: for every quantised weight `X.weight` the reference library's
own dequantisation (`X.weight`) and the unquantised source it was made from
(`X.weight.source`), so tests check both directions against the reference code.

  deepseek_fp8        DeepSeek-V3: float8_e4m3fn + float32 weight_scale_inv per 128x128
                      block; a weight with ragged edge blocks (one of them all zeros), one
                      smaller than a block; router and norm left in bfloat16.
  deepseek_fp8_ue8m0  DeepSeek-V3.1: the same with power-of-two scales (scale_fmt ue8m0).
  kimi_int4           Kimi-K2-Thinking/K2.5: compressed-tensors pack-quantized int4,
                      group 32, for the routed experts; attention / shared experts in
                      bfloat16 (the config's ignore list).
  reference/packing   compressed-tensors' int32 packing of 1..8-bit values.

FP8 weights are quantised by torch's float8_e4m3fn cast with DeepSeek's block-scale rule
(s = max(amax, 1e-4) / 448, power of two for ue8m0); the reference dequantisation is
transformers' DeepSeek's `weight_dequant` rule (fp32 q * s, cast to bf16) written in torch, which
handles ragged blocks; the tool first asserts that transformers' own `Fp8Dequantize`
(whole blocks only) gives the same bits on a whole-block weight. INT4 weights are quantised, packed and dequantised by
compressed-tensors itself (its min-max qparams, `PackedQuantizationCompressor`).
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                             QuantizationScheme)
from compressed_tensors.quantization.utils.helpers import calculate_qparams
from safetensors.torch import save_file
from transformers.integrations.finegrained_fp8 import Fp8Dequantize

OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "quant"
BLOCK = 128
KIMI_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
               r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"]


def _weight(gen: torch.Generator, rows: int, cols: int) -> torch.Tensor:
  """bf16 weights whose magnitude varies by row band and column band, so every block and
  group gets its own scale (a single global scale would hide indexing bugs)."""
  w = torch.randn(rows, cols, generator=gen)
  w *= torch.logspace(-3, 0, rows)[:, None] * torch.logspace(0, -1, cols)[None, :] * 4
  return w.to(torch.bfloat16)


def _fp8_quantize(w: torch.Tensor, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
  rows, cols = w.shape
  br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
  padded = torch.zeros(br * BLOCK, bc * BLOCK)
  padded[:rows, :cols] = w.float().abs()
  amax = padded.reshape(br, BLOCK, bc, BLOCK).amax(dim=(1, 3))
  scale = torch.clamp(amax, min=1e-4) / 448.0
  if ue8m0:
    scale = torch.exp2(torch.ceil(torch.log2(scale)))
  full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:rows, :cols]
  q = torch.clamp(w.float() / full, -448.0, 448.0).to(torch.float8_e4m3fn)
  return q, scale.float()


def _fp8_reference(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
  rows, cols = q.shape
  full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:rows, :cols]
  return (q.float() * full).to(torch.bfloat16)


def check_transformers_agrees(gen: torch.Generator) -> None:
  """transformers' Fp8Dequantize (whole blocks only) == the DeepSeek rule, bit for bit."""
  for ue8m0 in (False, True):
    q, scale = _fp8_quantize(_weight(gen, 256, 384), ue8m0)
    hf = Fp8Dequantize(None)._dequantize_one(q, scale, torch.bfloat16)
    assert torch.equal(hf.view(torch.int16), _fp8_reference(q, scale).view(torch.int16))


def _write(out: pathlib.Path, case: str, config: dict, stored: dict, reference: dict
           ) -> None:
  path = out / case
  path.mkdir(parents=True, exist_ok=True)
  (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
  save_file({k: v.contiguous() for k, v in stored.items()}, path / "model.safetensors",
            metadata={"format": "pt"})
  # Beside, not inside, the case: a reader takes every *.safetensors of a directory.
  (out / "reference").mkdir(exist_ok=True)
  ref_path = out / "reference" / f"{case}.safetensors"
  save_file({k: v.contiguous() for k, v in reference.items()}, ref_path,
            metadata={"format": "pt"})
  size = sum(p.stat().st_size for p in [*path.iterdir(), ref_path])
  print(f"{case}: {len(stored)} stored tensors, {size / 1024:.1f} KiB")


def make_fp8(out: pathlib.Path, case: str, ue8m0: bool, seed: int) -> None:
  gen = torch.Generator().manual_seed(seed)
  qc = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK]}
  if ue8m0:
    qc["scale_fmt"] = "ue8m0"
  config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "torch_dtype": "bfloat16", "quantization_config": qc}
  if ue8m0:
    weights = {"model.layers.3.self_attn.kv_b_proj.weight": _weight(gen, 40, 136),
               "model.layers.3.mlp.experts.0.gate_proj.weight": _weight(gen, 24, 40)}
  else:
    ragged = _weight(gen, 136, 130)
    ragged[BLOCK:, BLOCK:] = 0  # an all-zero corner block: the amax clamp gives it a scale
    weights = {"model.layers.3.self_attn.kv_b_proj.weight": ragged,
               "model.layers.3.mlp.experts.0.gate_proj.weight": _weight(gen, 24, 40)}
  stored, reference = {}, {}
  for name, w in weights.items():
    q, scale = _fp8_quantize(w, ue8m0)
    stored[name], stored[name + "_scale_inv"] = q, scale
    reference[name], reference[name + ".source"] = _fp8_reference(q, scale), w
  stored["model.layers.3.mlp.gate.weight"] = _weight(gen, 8, 40)  # router: bf16
  stored["model.layers.3.input_layernorm.weight"] = _weight(gen, 1, 40)[0]
  _write(out, case, config, stored, reference)


def make_int4(out: pathlib.Path, case: str, seed: int) -> None:
  gen = torch.Generator().manual_seed(seed)
  args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group",
                          group_size=32)
  scheme = QuantizationScheme(targets=["Linear"], weights=args)
  qc = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized",
                          ignore=KIMI_IGNORE, quantization_status="compressed").model_dump()
  config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
            "torch_dtype": "bfloat16", "quantization_config": qc}
  weights = {"model.layers.1.mlp.experts.0.gate_proj.weight": _weight(gen, 48, 96),
             "model.layers.1.mlp.experts.1.down_proj.weight": _weight(gen, 40, 64),
             "model.layers.1.mlp.experts.2.up_proj.weight": _weight(gen, 7, 32)}
  weights["model.layers.1.mlp.experts.1.down_proj.weight"][3:5, 32:] = 0  # zero groups
  stored, reference = {}, {}
  for name, w in weights.items():
    module = name.removesuffix(".weight")
    rows, cols = w.shape
    grouped = w.reshape(rows, cols // 32, 32)
    scale, zero_point = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
    compressed = PackedQuantizationCompressor.compress(
        {"weight": w, "weight_scale": scale, "weight_zero_point": zero_point}, scheme)
    for key, value in compressed.items():
      stored[f"{module}.{key}"] = value
    back = PackedQuantizationCompressor.decompress(dict(compressed), scheme)["weight"]
    reference[name], reference[name + ".source"] = back, w
  stored["model.layers.1.mlp.shared_experts.gate_proj.weight"] = _weight(gen, 16, 40)
  stored["model.layers.1.self_attn.o_proj.weight"] = _weight(gen, 40, 16)
  _write(out, case, config, stored, reference)


def make_packing(out: pathlib.Path, seed: int) -> None:
  """compressed-tensors' int32 packing of every width 1..8 (dense, fields may straddle
  words), rows of 45 values so the last word is partial."""
  gen = torch.Generator().manual_seed(seed)
  tables = {}
  for bits in range(1, 9):
    lo = -(1 << (bits - 1))
    q = torch.randint(lo, -lo, (3, 45), generator=gen, dtype=torch.int8)
    tables[f"q.{bits}"], tables[f"packed.{bits}"] = q, pack_to_int32(q, bits)
  path = out / "reference" / "packing.safetensors"
  save_file(tables, path, metadata={"format": "pt"})
  print(f"packing: {path.stat().st_size / 1024:.1f} KiB")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path, default=OUT)
  out = parser.parse_args().out
  check_transformers_agrees(torch.Generator().manual_seed(3))
  (out / "reference").mkdir(parents=True, exist_ok=True)
  make_fp8(out, "deepseek_fp8", ue8m0=False, seed=0)
  make_fp8(out, "deepseek_fp8_ue8m0", ue8m0=True, seed=1)
  make_int4(out, "kimi_int4", seed=2)
  make_packing(out, seed=4)


if __name__ == "__main__":
  main()
