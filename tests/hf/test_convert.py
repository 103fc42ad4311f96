"""Conversion: HF -> c2jax -> HF is bit-exact, sharding works, memory stays bounded."""

from __future__ import annotations

import json
import subprocess
import sys
import weakref

import ml_dtypes
import numpy as np
import pytest

from c2jax import hf
from c2jax.hf import checkpoint, names, safetensors_io
from c2jax.model import variants
from tests.hf.conftest import CASES, FIXTURES


def _tensors(hf_dir) -> dict[str, np.ndarray]:
  reader = safetensors_io.SafetensorsReader(hf_dir)
  return {name: reader.read(name) for name in reader.names()}


def _assert_bit_equal(a: dict, b: dict) -> None:
  assert sorted(a) == sorted(b)
  for name in a:
    assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
    assert a[name].tobytes() == b[name].tobytes(), f"{name} differs"


def _leaves(tree, prefix=()):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _leaves(value, prefix + (key,))
    else:
      yield prefix + (key,), value


@pytest.mark.parametrize("case", CASES)
def test_round_trip_through_checkpoint_is_bit_exact(case, tmp_path, loaded):
  source = FIXTURES / case
  summary = hf.convert_from_hf(source, tmp_path / "ckpt")
  hf.convert_to_hf(tmp_path / "ckpt", tmp_path / "back")
  original = _tensors(source)
  if case.startswith("kimi"):  # written back as the text backbone's own architecture
    original = {n.removeprefix("language_model."): t for n, t in original.items()}
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == (
        "deepseek_v3")
  _assert_bit_equal(original, _tensors(tmp_path / "back"))
  assert summary["tensors"] == len(original) and summary["skipped"] == 0
  # The checkpoint's own loader agrees with hf.load leaf for leaf, dtype included.
  cfg, params = hf.load_checkpoint(tmp_path / "ckpt")
  ref_cfg, ref_params = loaded(case)
  assert cfg == ref_cfg
  ours, ref = dict(_leaves(params)), dict(_leaves(ref_params))
  assert sorted(ours) == sorted(ref)
  for path in ref:
    np.testing.assert_array_equal(ours[path], ref[path], err_msg="/".join(path))
    assert ours[path].dtype == ref[path].dtype


def test_hf_config_survives_round_trip(tmp_path):
  source = FIXTURES / "deepseek_v3_grouped_yarn"
  hf.convert_from_hf(source, tmp_path / "ckpt")
  hf.convert_to_hf(tmp_path / "ckpt", tmp_path / "back")
  before = json.loads((source / "config.json").read_text())
  after = json.loads((tmp_path / "back" / "config.json").read_text())
  for key in ("n_group", "topk_group", "rope_parameters", "bos_token_id", "eos_token_id",
              "q_lora_rank", "first_k_dense_replace", "routed_scaling_factor"):
    assert after[key] == before[key], key


def test_save_writes_several_shards_with_index(tmp_path, loaded):
  cfg, params = loaded("qwen3_moe_norm")
  hf.save(cfg, params, tmp_path / "out", max_shard_bytes=64 * 1024)
  shards = sorted((tmp_path / "out").glob("*.safetensors"))
  index = json.loads((tmp_path / "out" / safetensors_io.INDEX_FILE).read_text())
  assert len(shards) > 2
  assert set(index["weight_map"].values()) == {p.name for p in shards}
  written = _tensors(tmp_path / "out")
  assert index["metadata"]["total_size"] == sum(t.nbytes for t in written.values())
  _assert_bit_equal(_tensors(FIXTURES / "qwen3_moe_norm"), _tensors(tmp_path / "out"))
  cfg2, _ = hf.load(tmp_path / "out")
  assert cfg2 == cfg


def test_save_refuses_leaves_it_would_drop(tmp_path, loaded):
  cfg, params = loaded("qwen3_moe_norm")
  with pytest.raises(ValueError, match="mtp/scale"):
    hf.save(cfg, dict(params, mtp={"scale": np.ones(3, np.float32)}), tmp_path / "out")


def test_bfloat16_bits_survive(tmp_path, loaded):
  cfg, params = loaded("deepseek_v3_qproj_plain")
  cfg = cfg.copy_and_resolve_references()
  cfg.dtype = cfg.param_dtype = "bfloat16"
  bf16 = {}
  for path, value in _leaves(params):
    node = bf16
    for key in path[:-1]:
      node = node.setdefault(key, {})
    keep_f32 = path[-1] == "correction_bias"  # float32 by contract, as HF keeps it
    node[path[-1]] = value if keep_f32 else value.astype(ml_dtypes.bfloat16)
  hf.save(cfg, bf16, tmp_path / "a")
  hf.convert_from_hf(tmp_path / "a", tmp_path / "ckpt")
  hf.convert_to_hf(tmp_path / "ckpt", tmp_path / "b")
  tensors = _tensors(tmp_path / "b")
  assert tensors["model.layers.0.mlp.gate.e_score_correction_bias"].dtype == np.float32
  assert tensors["lm_head.weight"].dtype == ml_dtypes.bfloat16
  _assert_bit_equal(_tensors(tmp_path / "a"), tensors)
  assert json.loads((tmp_path / "b" / "config.json").read_text())["dtype"] == "bfloat16"


class _LiveBytes:
  """Counts bytes of arrays handed out and still referenced somewhere (peak kept)."""

  def __init__(self):
    self.live = self.peak = 0

  def track(self, array: np.ndarray) -> np.ndarray:
    self.live += array.nbytes
    self.peak = max(self.peak, self.live)
    weakref.finalize(array, self._release, array.nbytes)
    return array

  def _release(self, nbytes: int) -> None:
    self.live -= nbytes


class _TrackedReader(safetensors_io.SafetensorsReader):
  def __init__(self, hf_dir, meter):
    super().__init__(hf_dir)
    self.meter = meter

  def read(self, name):
    return self.meter.track(super().read(name))


class _TrackedSource(checkpoint.CheckpointReader):
  def __init__(self, ckpt_dir, meter):
    super().__init__(ckpt_dir)
    self.meter = meter

  def read(self, path, index):
    return self.meter.track(np.array(super().read(path, index)))


def test_streaming_conversion_holds_one_tensor_at_a_time(tmp_path):
  cfg = variants.get("tiny", vocab_size=256, num_layers=3, first_k_dense=1)
  cfg.moe.num_experts, cfg.moe.intermediate_size = 16, 64
  rng = np.random.default_rng(0)
  params = {}
  for leaf in names.leaves(cfg):
    node = params
    for key in leaf.path[:-1]:
      node = node.setdefault(key, {})
    node[leaf.path[-1]] = rng.standard_normal(leaf.shape, dtype=np.float32)
  hf.save(cfg, params, tmp_path / "hf", max_shard_bytes=256 * 1024)
  sizes = [t.nbytes for t in _tensors(tmp_path / "hf").values()]
  assert sum(sizes) > 20 * max(sizes)  # the bound below is far from "everything"

  meter = _LiveBytes()
  reader = _TrackedReader(tmp_path / "hf", meter)
  hf.convert_from_hf(tmp_path / "hf", tmp_path / "ckpt", reader=reader)
  assert meter.peak == max(sizes) and meter.live == 0

  meter = _LiveBytes()
  source = _TrackedSource(tmp_path / "ckpt", meter)
  hf.convert_to_hf(tmp_path / "ckpt", tmp_path / "back", source=source,
                   max_shard_bytes=256 * 1024)
  assert meter.peak == max(sizes) and meter.live == 0
  _assert_bit_equal(_tensors(tmp_path / "hf"), _tensors(tmp_path / "back"))


def test_cli_converts_both_ways(tmp_path):
  source = FIXTURES / "qwen3_moe_nonorm_yarn"

  def run(*args):
    return subprocess.run([sys.executable, "-m", "c2jax.cli", "convert", *map(str, args)],
                          capture_output=True, text=True, timeout=120,
                          cwd=FIXTURES.parents[2])

  first = run("--from-hf", source, "--out", tmp_path / "ckpt")
  assert first.returncode == 0, first.stderr
  assert json.loads(first.stdout.strip().splitlines()[-1])["tensors"] == len(_tensors(source))
  second = run("--from", tmp_path / "ckpt", "--to-hf", tmp_path / "back")
  assert second.returncode == 0, second.stderr
  _assert_bit_equal(_tensors(source), _tensors(tmp_path / "back"))


def _copy_fixture(case, dst, drop=None, add=None):
  dst.mkdir()
  (dst / "config.json").write_text((FIXTURES / case / "config.json").read_text())
  tensors = _tensors(FIXTURES / case)
  tensors.pop(drop, None)
  tensors.update(add or {})
  plan = [safetensors_io.PlannedTensor(n, t.dtype, t.shape, lambda t=t: t)
          for n, t in tensors.items()]
  safetensors_io.write_sharded(dst, plan, 1 << 30)


def test_errors_name_the_problem(tmp_path):
  case = "deepseek_v3_qproj_plain"
  _copy_fixture(case, tmp_path / "missing", drop="model.layers.1.mlp.experts.3.up_proj.weight")
  with pytest.raises(ValueError, match="experts.3.up_proj"):
    hf.load(tmp_path / "missing")
  scale = {"model.layers.0.mlp.experts.0.up_proj.weight_scale_inv": np.ones(1, np.float32)}
  _copy_fixture(case, tmp_path / "fp8", add=scale)
  with pytest.raises(ValueError, match="dequantize"):
    hf.load(tmp_path / "fp8")
  mtp = {"model.layers.2.enorm.weight": np.ones(32, np.float32)}  # an MTP layer: skipped
  _copy_fixture(case, tmp_path / "mtp", add=mtp)
  summary = hf.convert_from_hf(tmp_path / "mtp", tmp_path / "ckpt")
  assert summary["skipped"] == 1 and "multi-token" in summary["skipped_reasons"][0]
  with pytest.raises(FileExistsError, match="already holds"):
    hf.convert_from_hf(tmp_path / "mtp", tmp_path / "ckpt")
  with pytest.raises(FileExistsError, match="safetensors"):
    hf.convert_to_hf(tmp_path / "ckpt", tmp_path / "mtp")
  with pytest.raises(FileNotFoundError, match="not a complete c2jax checkpoint"):
    hf.load_checkpoint(tmp_path / "missing")


def test_shape_mismatch_fails_before_writing(tmp_path):
  name = "model.layers.0.self_attn.kv_b_proj.weight"
  _copy_fixture("deepseek_v3_qproj_plain", tmp_path / "bad",
                add={name: np.zeros((7, 16), np.float32)})
  with pytest.raises(ValueError, match="kv_b_proj.weight' has shape \\[7, 16\\]"):
    hf.convert_from_hf(tmp_path / "bad", tmp_path / "ckpt")
  assert not (tmp_path / "ckpt" / checkpoint.PARAMS_DIR).exists()
