"""DeepSeek-V3 MTP layers in HF checkpoints: layout, bit-exact round trips, shared copies."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from c2jax import hf, model
from c2jax.hf import safetensors_io
from tests.hf.conftest import FIXTURES
from tests.model.conftest import draw_params

DEPTHS = 2  # two depths, so layer indices num_layers and num_layers + 1 are both checked


def _tensors(hf_dir) -> dict[str, np.ndarray]:
  reader = safetensors_io.SafetensorsReader(hf_dir)
  return {name: reader.read(name) for name in reader.names()}


def _write(hf_dir, config: dict, tensors: dict) -> None:
  hf_dir.mkdir()
  (hf_dir / "config.json").write_text(json.dumps(config))
  plan = [safetensors_io.PlannedTensor(n, t.dtype, t.shape, lambda t=t: t)
          for n, t in tensors.items()]
  safetensors_io.write_sharded(hf_dir, plan, 1 << 30)


def _leaves(tree):
  return {"/".join(getattr(k, "key", str(k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A tiny DeepSeek-V3 (the plain fixture's shape) with MTP depths, saved by hf.save."""
  base, _ = hf.load(FIXTURES / "deepseek_v3_qproj_plain")
  cfg = base.copy_and_resolve_references()
  cfg.num_mtp_layers = DEPTHS
  shapes = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  params = jax.tree.map(np.asarray, draw_params(shapes, 0.1, seed=5))
  out = tmp_path_factory.mktemp("mtp") / "hf"
  hf.save(cfg, params, out)
  return cfg, params, out


def test_save_writes_deepseek_mtp_layout(saved):
  cfg, params, out = saved
  config = json.loads((out / "config.json").read_text())
  assert config["num_nextn_predict_layers"] == DEPTHS
  tensors = _tensors(out)
  d, n = cfg.hidden_size, cfg.num_layers
  for k in range(DEPTHS):
    layer = f"model.layers.{n + k}."
    mtp = params["mtp_layers"]
    np.testing.assert_array_equal(tensors[layer + "enorm.weight"], mtp["enorm"]["scale"][k])
    np.testing.assert_array_equal(tensors[layer + "hnorm.weight"], mtp["hnorm"]["scale"][k])
    np.testing.assert_array_equal(tensors[layer + "shared_head.norm.weight"],
                                  mtp["final_norm"]["scale"][k])
    # nn.Linear(2D -> D): weight [D, 2D], input columns [embedding | hidden].
    assert tensors[layer + "eh_proj.weight"].shape == (d, 2 * d)
    np.testing.assert_array_equal(tensors[layer + "eh_proj.weight"],
                                  mtp["eh_proj"]["kernel"][k].T)
    np.testing.assert_array_equal(tensors[layer + "mlp.experts.1.up_proj.weight"],
                                  mtp["block"]["moe"]["experts"]["up_proj"][k, 1].T)
    assert layer + "self_attn.kv_b_proj.weight" in tensors
    np.testing.assert_array_equal(tensors[layer + "embed_tokens.weight"],
                                  tensors["model.embed_tokens.weight"])
    np.testing.assert_array_equal(tensors[layer + "shared_head.head.weight"],
                                  tensors["lm_head.weight"])
  assert not any(name.startswith(f"model.layers.{n + DEPTHS}.") for name in tensors)


def test_load_and_checkpoint_round_trips_are_bit_exact(saved, tmp_path):
  cfg, params, out = saved
  cfg2, params2 = hf.load(out)
  assert cfg2 == cfg
  ours, ref = _leaves(params2), _leaves(params)
  assert sorted(ours) == sorted(ref)
  for path in ref:
    assert ours[path].tobytes() == ref[path].tobytes() and ours[path].dtype == ref[path].dtype
  summary = hf.convert_from_hf(out, tmp_path / "ckpt")
  hf.convert_to_hf(tmp_path / "ckpt", tmp_path / "back")
  original, back = _tensors(out), _tensors(tmp_path / "back")
  assert sorted(original) == sorted(back) and summary["skipped"] == 0
  for name in original:
    assert original[name].tobytes() == back[name].tobytes(), name
  assert json.loads((tmp_path / "back" / "config.json").read_text())[
      "num_nextn_predict_layers"] == DEPTHS


def test_shared_copies_are_checked_on_load(saved, tmp_path):
  cfg, _, out = saved
  config = json.loads((out / "config.json").read_text())
  tensors = _tensors(out)
  copy = f"model.layers.{cfg.num_layers}.shared_head.head.weight"
  _write(tmp_path / "differs", config, dict(tensors, **{copy: tensors[copy] + 1}))
  with pytest.warns(UserWarning, match="shared_head.head.weight' differs from 'lm_head"):
    _, params = hf.load(tmp_path / "differs")
  np.testing.assert_array_equal(params["lm_head"]["kernel"], tensors["lm_head.weight"].T)
  _write(tmp_path / "bad_shape", config, dict(tensors, **{copy: tensors[copy][:3]}))
  with pytest.raises(ValueError, match="should copy 'lm_head.weight'"):
    hf.load(tmp_path / "bad_shape")
  # Fewer depths in config.json than stored: the extra layer is skipped and named.
  _write(tmp_path / "fewer", dict(config, num_nextn_predict_layers=1), tensors)
  summary = hf.convert_from_hf(tmp_path / "fewer", tmp_path / "ckpt")
  assert summary["skipped"] > 0
  assert summary["skipped_reasons"] == [
      "multi-token-prediction layer beyond config.json's num_nextn_predict_layers = 1"]
  loaded_cfg, params = hf.load_checkpoint(tmp_path / "ckpt")
  assert loaded_cfg.num_mtp_layers == 1
  assert params["mtp_layers"]["eh_proj"]["kernel"].shape[0] == 1


def test_missing_mtp_tensor_is_an_error(saved, tmp_path):
  cfg, _, out = saved
  tensors = _tensors(out)
  del tensors[f"model.layers.{cfg.num_layers + 1}.eh_proj.weight"]
  _write(tmp_path / "missing", json.loads((out / "config.json").read_text()), tensors)
  with pytest.raises(ValueError, match="eh_proj"):
    hf.load(tmp_path / "missing")


def test_qwen3_with_mtp_has_no_hf_layout(tmp_path):
  cfg, _ = hf.load(FIXTURES / "qwen3_moe_norm")
  cfg = cfg.copy_and_resolve_references()
  cfg.num_mtp_layers = 1
  with pytest.raises(ValueError, match="num_mtp_layers = 0"):
    hf.to_hf(cfg)
