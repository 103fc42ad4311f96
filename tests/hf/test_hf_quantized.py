"""Released quantised formats: dequantisation and re-quantisation against the reference
libraries' own outputs (tests/fixtures/quant, made by tools/fixtures/make_quant_fixtures.py), the
exact on-disk layout, bad checkpoints and configs, and the load/export hooks end to end."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from c2jax import hf
from c2jax.hf import quant_formats as qf
from c2jax.hf import names, quant_schemes, quantized, safetensors_io
from tests import torch_reference
from tests.hf.conftest import FIXTURES as HF_FIXTURES

QUANT = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "quant"
CASES = ["deepseek_fp8", "deepseek_fp8_ue8m0", "kimi_int4"]
BF16 = np.dtype(ml_dtypes.bfloat16)


def _config(case: str) -> dict:
  return json.loads((QUANT / case / "config.json").read_text())


def _all(reader) -> dict[str, np.ndarray]:
  return {name: reader.read(name) for name in reader.names()}


@pytest.fixture(scope="module")
def fixture():
  """case -> (logical reader, stored tensors, reference tensors), read once."""
  cache = {}

  def get(case: str):
    if case not in cache:
      _, reader = quantized.open_hf(QUANT / case, _config(case))
      stored = _all(safetensors_io.SafetensorsReader(QUANT / case))
      ref_file = safetensors_io.SafetensorsReader.__new__(safetensors_io.SafetensorsReader)
      ref_file.dir = QUANT / "reference"
      ref_file.tensors = {i.name: i for i in safetensors_io._read_header(
          QUANT / "reference" / f"{case}.safetensors")}
      cache[case] = reader, stored, _all(ref_file)
    return cache[case]

  return get


def _bytes_equal(a: np.ndarray, b: np.ndarray) -> bool:
  return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("case", CASES)
def test_dequantize_equals_reference_library(case, fixture):
  reader, stored, reference = fixture(case)
  quantised = sorted(n for n in reference if not n.endswith(".source"))
  plain = sorted(n for n in stored if n.endswith(".weight") and n not in quantised)
  # Stored scale / packing tensors are hidden behind the logical weight names.
  assert sorted(reader.names()) == sorted(quantised + plain)
  for name in quantised:
    assert reader.is_quantized(name)
    assert reader.tensors[name].dtype == BF16 and reader.tensors[name].shape == (
        reference[name].shape)
    assert _bytes_equal(reader.read(name), reference[name]), name
  for name in plain:  # router, norms, ignored modules pass through untouched
    assert not reader.is_quantized(name) and _bytes_equal(reader.read(name), stored[name])


@pytest.mark.parametrize("case", CASES)
def test_quantize_for_export_writes_the_reference_bytes(case, fixture):
  """From the same source weights our quantiser writes exactly what the library wrote;
  from our own dequantisation (bf16) it writes the original tensors back."""
  reader, stored, reference = fixture(case)
  scheme = quantized.scheme_from_config(_config(case))
  for name in (n for n in reference if not n.endswith(".source")):
    for source in (reference[name + ".source"], reader.read(name)):
      out = quantized.quantize_for_export(name, source, scheme)
      assert sorted(out) == sorted(k for k in stored if k.rsplit(".", 1)[0] ==
                                   name.removesuffix(".weight"))
      for key, value in out.items():
        assert _bytes_equal(value, stored[key]), key


@pytest.mark.parametrize("case", CASES)
def test_unquantised_modules_stay_plain_on_export(case, fixture):
  reader, stored, _ = fixture(case)
  scheme = quantized.scheme_from_config(_config(case))
  for name in reader.names():
    if not reader.is_quantized(name):
      array = reader.read(name)
      assert quantized.quantize_for_export(name, array, scheme) == {name: array}


def test_dequantize_into_float32(fixture):
  reference_fp8 = fixture("deepseek_fp8")[2]
  _, reader = quantized.open_hf(QUANT / "deepseek_fp8", _config("deepseek_fp8"),
                                dtype=np.float32)
  name = "model.layers.3.self_attn.kv_b_proj.weight"
  values = reader.read(name)
  assert values.dtype == np.float32 and reader.tensors[name].dtype == np.float32
  assert _bytes_equal(values.astype(BF16), reference_fp8[name])  # bf16 is one rounding of it
  assert not _bytes_equal(values, reference_fp8[name].astype(np.float32))
  # INT4 products pass through the scale dtype (bf16) as compressed-tensors computes them.
  _, reader = quantized.open_hf(QUANT / "kimi_int4", _config("kimi_int4"), dtype=np.float32)
  name = "model.layers.1.mlp.experts.0.gate_proj.weight"
  assert _bytes_equal(reader.read(name), fixture("kimi_int4")[2][name].astype(np.float32))


def test_fp8_scales_stored_as_e8m0(tmp_path, fixture):
  """ue8m0 scales may be stored as 1-byte float8_e8m0fnu (transformers' V4-style)."""
  _, stored, reference = fixture("deepseek_fp8_ue8m0")
  scales = {n: t.astype(ml_dtypes.float8_e8m0fnu) for n, t in stored.items()
            if n.endswith("weight_scale_inv")}
  path = _rewrite("deepseek_fp8_ue8m0", tmp_path, replace=scales)
  _, reader = quantized.open_hf(path, _config("deepseek_fp8_ue8m0"))
  for name in (n for n in reference if not n.endswith(".source")):
    assert _bytes_equal(reader.read(name), reference[name]), name


def _leaves(tree, prefix=()):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _leaves(value, prefix + (key,))
    else:
      yield prefix + (key,), value


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _rewrite(case: str, tmp_path, drop=(), replace=None) -> pathlib.Path:
  """A copy of a fixture case with stored tensors dropped or replaced."""
  out = tmp_path / case
  out.mkdir()
  shutil.copy(QUANT / case / "config.json", out / "config.json")
  reader = safetensors_io.SafetensorsReader(QUANT / case)
  tensors = {n: reader.read(n) for n in reader.names() if n not in drop}
  tensors.update(replace or {})
  plan = [safetensors_io.PlannedTensor(n, t.dtype, t.shape, lambda t=t: t)
          for n, t in tensors.items()]
  safetensors_io.write_sharded(out, plan, 2**30)
  return out


KV_B = "model.layers.3.self_attn.kv_b_proj"
EXPERT = "model.layers.1.mlp.experts.0.gate_proj"


@pytest.mark.parametrize("case,drop,replace,words", [
    ("deepseek_fp8", [KV_B + ".weight_scale_inv"], None,
     [f"'{KV_B}.weight'", f"'{KV_B}.weight_scale_inv' is missing"]),
    ("deepseek_fp8", [], {KV_B + ".weight_scale_inv": np.ones((1, 1), np.float32)},
     [f"'{KV_B}.weight_scale_inv' has shape [1, 1], expected [2, 2]", "128x128"]),
    ("deepseek_fp8", [KV_B + ".weight"], None, [f"'{KV_B}.weight_scale_inv' has no"]),
    ("kimi_int4", [EXPERT + ".weight_shape"], None, [f"'{EXPERT}.weight_shape' is missing"]),
    ("kimi_int4", [], {EXPERT + ".weight_packed": np.zeros((48, 11), np.int32)},
     [f"'{EXPERT}.weight_packed' has shape [48, 11], expected [48, 12]"]),
    ("kimi_int4", [], {EXPERT + ".weight_shape": np.array([48, 64], np.int64)},
     [f"'{EXPERT}.weight_packed' has shape [48, 12], expected [48, 8]"]),
    ("kimi_int4", [], {EXPERT + ".weight_scale": np.ones((48, 2), BF16)},
     [f"'{EXPERT}.weight_scale' has shape [48, 2], expected [48, 3]"]),
    ("kimi_int4", [], {EXPERT + ".weight_zero_point": np.zeros((6, 3), np.int32)},
     [f"'{EXPERT}.weight_zero_point'", "symmetric"]),
])
def test_bad_checkpoints_name_the_tensor(case, drop, replace, words, tmp_path):
  path = _rewrite(case, tmp_path, drop, replace)
  with pytest.raises(ValueError) as error:
    quantized.open_hf(path, _config(case))
  for word in words:
    assert word in str(error.value)


INT4_G16 = quant_schemes.PackedInt(groups=(quant_schemes.IntGroup(("Linear",), 4, 16),))


@pytest.mark.parametrize("scheme", ["fp8", "fp8-ue8m0", INT4_G16],
                         ids=["fp8", "fp8-ue8m0", "int4-g16"])
def test_save_quantized_then_load_and_convert(scheme, tmp_path, loaded):
  """hf.save(quantize=) writes the released layout; hf.load / convert_from_hf read it
  back dequantised; saving the loaded params again reproduces the files byte for byte."""
  cfg, params = loaded("deepseek_v3_grouped_yarn")
  hf.save(cfg, params, tmp_path / "q", quantize=scheme)
  config = json.loads((tmp_path / "q" / "config.json").read_text())
  assert quantized.scheme_from_config(config) == quantized.export_scheme(scheme)
  stored = _all(safetensors_io.SafetensorsReader(tmp_path / "q"))
  expert = "model.layers.1.mlp.experts.0.up_proj."
  if isinstance(scheme, str):  # fp8: the weight keeps its name, with a block scale beside
    assert stored[expert + "weight"].dtype == qf.FP8 and expert + "weight_scale_inv" in stored
  else:
    assert expert + "weight_packed" in stored and expert + "weight" not in stored
  assert "model.layers.1.mlp.gate.weight" in stored  # the router stays plain
  cfg2, params2 = hf.load(tmp_path / "q")
  assert cfg2 == cfg
  up, up2 = (p["moe_layers"]["moe"]["experts"]["up_proj"] for p in (params, params2))
  assert up2.dtype == np.float32 and not np.array_equal(up, up2)
  assert np.abs(up2 - up).max() <= np.abs(up).max() / 8  # a quantisation's error, no more
  np.testing.assert_array_equal(params2["final_norm"]["scale"], params["final_norm"]["scale"])
  hf.save(cfg2, params2, tmp_path / "again", quantize=scheme)
  again = _all(safetensors_io.SafetensorsReader(tmp_path / "again"))
  assert sorted(again) == sorted(stored)
  if scheme == "fp8-ue8m0":  # q = 448 at scale s and q = 224 at 2s decode alike: values
    for path, value in _leaves(hf.load(tmp_path / "again")[1]):
      np.testing.assert_array_equal(value, _get(params2, path), err_msg="/".join(path))
  else:
    for name in stored:
      assert _bytes_equal(again[name], stored[name]), name
  summary = hf.convert_from_hf(tmp_path / "q", tmp_path / "ckpt")
  assert summary["skipped"] == 0
  cfg3, params3 = hf.load_checkpoint(tmp_path / "ckpt")
  assert cfg3 == cfg
  np.testing.assert_array_equal(params3["moe_layers"]["moe"]["experts"]["up_proj"], up2)
  source = json.loads((tmp_path / "ckpt" / "hf_source_config.json").read_text())
  assert "quantization_config" not in source  # the checkpoint holds dequantised weights


def test_unquantised_checkpoints_are_untouched():
  config = json.loads((HF_FIXTURES / "qwen3_moe_norm" / "config.json").read_text())
  same, reader = quantized.open_hf(HF_FIXTURES / "qwen3_moe_norm", config)
  assert same is config and isinstance(reader, safetensors_io.SafetensorsReader)


class _CountingReader(safetensors_io.SafetensorsReader):
  """Records which stored tensors are read, to prove reads happen one weight at a time."""

  def __init__(self, path):
    super().__init__(path)
    self.reads: list[str] = []

  def read(self, name):
    self.reads.append(name)
    return super().read(name)


def test_reading_streams_one_weight_at_a_time():
  base = _CountingReader(QUANT / "kimi_int4")
  _, reader = quantized.open_hf(QUANT / "kimi_int4", _config("kimi_int4"), base)
  assert base.reads == []  # headers (and tiny weight_shape tensors, in bulk) only
  reader.read(EXPERT + ".weight")
  assert sorted(base.reads) == sorted(f"{EXPERT}.{s}" for s in (
      "weight_packed", "weight_scale", "weight_shape"))
  # Logical tensors keep the on-disk order of their stored weights (sequential reads).
  starts = [info.start for info in reader.tensors.values()]
  assert starts == sorted(starts)


def test_cli_dequantises_in_and_quantises_out(tmp_path, loaded):
  cfg, params = loaded("deepseek_v3_qproj_plain")
  hf.save(cfg, params, tmp_path / "fp8", quantize="fp8")

  def run(*args):
    return subprocess.run([sys.executable, "-m", "c2jax.cli", "convert", *map(str, args)],
                          capture_output=True, text=True, timeout=120,
                          cwd=QUANT.parents[2])

  first = run("--from-hf", tmp_path / "fp8", "--out", tmp_path / "ckpt")
  assert first.returncode == 0, first.stderr
  second = run("--from", tmp_path / "ckpt", "--to-hf", tmp_path / "back", "--quantize", "fp8")
  assert second.returncode == 0, second.stderr
  original = _all(safetensors_io.SafetensorsReader(tmp_path / "fp8"))
  back = _all(safetensors_io.SafetensorsReader(tmp_path / "back"))
  assert sorted(back) == sorted(original)
  for name in original:
    assert _bytes_equal(back[name], original[name]), name


def test_reference_libraries_still_write_the_fixtures(tmp_path):
  """Live: the installed torch / transformers / compressed-tensors regenerate every
  committed fixture byte for byte (so an upstream format change cannot go unnoticed)."""
  python = torch_reference.torch_python("torch", "transformers", "compressed_tensors")
  tool = QUANT.parents[2] / "tools" / "fixtures" / "make_quant_fixtures.py"
  result = subprocess.run([python, str(tool), "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=torch_reference.clean_env())
  assert result.returncode == 0, result.stdout + result.stderr
  committed = sorted(p.relative_to(QUANT) for p in QUANT.rglob("*") if p.is_file())
  assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()) == (
      committed)
  for path in committed:
    assert (tmp_path / path).read_bytes() == (QUANT / path).read_bytes(), path


def test_kimi_k25_wrapper_with_int4_experts_loads(tmp_path, loaded):
  """Kimi-K2.5's layout: quantization_config at the top, text weights under
  `language_model.`, only routed experts packed; hf.load dequantises it."""
  case = "kimi_k25_text"
  config = json.loads((HF_FIXTURES / case / "config.json").read_text())
  # Plain ignore entries are exact module names (compressed-tensors' rule): the prefix
  # counts, so the wrapped LM head is named in full.
  scheme = quant_schemes.PackedInt(groups=(quant_schemes.IntGroup(("Linear",), 4, 16),),
                                   ignore=quant_schemes.KIMI_IGNORE + (
                                       "language_model.lm_head",))
  config["quantization_config"] = scheme.hf_config()
  (tmp_path / "k25").mkdir()
  (tmp_path / "k25" / "config.json").write_text(json.dumps(config))
  source = safetensors_io.SafetensorsReader(HF_FIXTURES / case)
  plan = []
  for name in source.names():
    for stored, array in quantized.quantize_for_export(name, source.read(name), scheme).items():
      plan.append(safetensors_io.PlannedTensor(stored, array.dtype, array.shape,
                                               lambda a=array: a))
  safetensors_io.write_sharded(tmp_path / "k25", plan, 2**30)
  packed = [p.name for p in plan if p.name.endswith("weight_packed")]
  assert packed and all(".mlp.experts." in n and n.startswith("language_model.")
                        for n in packed)
  cfg, params = hf.load(tmp_path / "k25")
  ref_cfg, ref_params = loaded(case)
  assert cfg == ref_cfg
  for path, value in _leaves(ref_params):
    ours = _get(params, path)
    assert ours.dtype == value.dtype, path
    if path[-2:-1] == ("experts",):  # quantised: within the int4 error of each group
      assert np.abs(ours - value).max() <= np.abs(value).max() / 8 and not np.array_equal(
          ours, value)
    else:
      np.testing.assert_array_equal(ours, value, err_msg="/".join(path))


def test_other_tensors_of_a_quantised_module_pass_through(tmp_path):
  bias = np.arange(136, dtype=np.float32).astype(BF16)
  path = _rewrite("deepseek_fp8", tmp_path, replace={KV_B + ".bias": bias})
  _, reader = quantized.open_hf(path, _config("deepseek_fp8"))
  assert reader.is_quantized(KV_B + ".weight") and not reader.is_quantized(KV_B + ".bias")
  assert _bytes_equal(reader.read(KV_B + ".bias"), bias)


def test_weight_stored_both_plain_and_packed_is_refused(tmp_path):
  path = _rewrite("kimi_int4", tmp_path, replace={EXPERT + ".weight": np.ones((48, 96), BF16)})
  with pytest.raises(ValueError, match=f"'{EXPERT}.weight' is stored both plain and as "
                     f"'{EXPERT}.weight_packed'"):
    quantized.open_hf(path, _config("kimi_int4"))


def test_mtp_layers_quantise_like_decoder_layers(tmp_path, loaded):
  """DeepSeek-V3's MTP layers in FP8: projections (eh_proj included) block-scaled, the
  shared embedding / head copies plain, and all of it loads back."""
  base, base_params = loaded("deepseek_v3_qproj_plain")
  cfg = base.copy_and_resolve_references()
  cfg.num_mtp_layers = 1
  rng = np.random.default_rng(0)
  params = {}
  for leaf in names.leaves(cfg):
    node = params
    for key in leaf.path[:-1]:
      node = node.setdefault(key, {})
    try:
      node[leaf.path[-1]] = _get(base_params, leaf.path)
    except KeyError:
      node[leaf.path[-1]] = (rng.standard_normal(leaf.shape) * 0.1).astype(np.float32)
  hf.save(cfg, params, tmp_path / "q", quantize="fp8")
  stored = safetensors_io.SafetensorsReader(tmp_path / "q").tensors
  mtp = f"model.layers.{cfg.num_layers}."
  assert stored[mtp + "eh_proj.weight"].dtype == qf.FP8
  assert mtp + "eh_proj.weight_scale_inv" in stored
  for copy in ("embed_tokens.weight", "shared_head.head.weight"):
    assert stored[mtp + copy].dtype == np.float32 and mtp + copy + "_scale_inv" not in stored
  cfg2, params2 = hf.load(tmp_path / "q")
  assert cfg2 == cfg
  eh, eh2 = (p[names.MTP_KEY]["eh_proj"]["kernel"] for p in (params, params2))
  assert np.abs(eh2 - eh).max() <= np.abs(eh).max() / 8
