"""The loop end to end: an HF directory written by transformers -> `c2jax pretrain
--config.init_from=DIR` (2 steps) -> `c2jax export` -> the exported directory's logits
equal c2jax's within 1e-4 (float32): live against transformers where an interpreter with
torch is at hand ($C2JAX_TORCH_PYTHON, tests/torch_reference.py), and always
through c2jax's own HF loader, whose parity with transformers the committed fixture's
logits pin down."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from c2jax import hf, model
from c2jax.hf import sources
from c2jax.train import checkpoint as checkpoint_lib
from tests import torch_reference

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAVED = ROOT / "tests" / "fixtures" / "hf_saved" / "deepseek_v3_mtp_declared"
TOLERANCE = 1e-4
_TINY = ["--config.train.seq_len=32", "--config.train.batch_size=8",
         "--config.train.eval_every=0", "--config.train.checkpoint_every=2",
         "--config.train.steps=2", "--config.train.warmup_steps=1",
         "--config.data.max_total_bytes=4000000", "--config.data.tokenizer_train_bytes=300000"]


def _cli(*args, timeout=600):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  done = subprocess.run([sys.executable, "-m", "c2jax.cli", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout, check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  return done.stdout


@pytest.fixture(scope="module")
def run(tmp_path_factory, data_cache):
  root = tmp_path_factory.mktemp("hf_e2e")
  # The README's command: the model config comes from the directory (MTP declared: one
  # module, started fresh since its tensors are absent).
  train_log = _cli("pretrain", f"--config=configs/from_hf.py:{SAVED}", f"--workdir={root / 'run'}",
                   f"--config.data.cache_dir={data_cache}", f"--config.init_from={SAVED}",
                   *_TINY)
  export_log = _cli("export", f"--run={root / 'run'}", f"--to-hf={root / 'out'}",
                    "--dtype=float32")
  return root, train_log, json.loads(export_log.strip().splitlines()[-1])


def _run_logits(root: pathlib.Path, tokens: np.ndarray):
  cfg = sources.model_config(root / "run")
  ckpt = checkpoint_lib.Checkpointer(root / "run" / "checkpoints", async_save=False)
  abstract = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  params = ckpt.restore_params(None, checkpoint_lib.abstract_like(abstract))
  ckpt.close()
  return cfg, params, np.asarray(model.forward(cfg, params, tokens))


@pytest.mark.slow
def test_pretrain_from_transformers_dir_then_export_matches(run):
  root, train_log, summary = run
  assert "declares num_nextn_predict_layers = 1 but stores no MTP tensors" in train_log
  assert "MTP module(s) start from a fresh initialisation" in train_log
  assert summary["step"] == 2 and summary["mtp_layers"] == 1
  out = root / "out"
  for name in ("config.json", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json", "model.safetensors.index.json"):
    assert (out / name).exists(), name
  exported = json.loads((out / "config.json").read_text())
  source = json.loads((SAVED / "config.json").read_text())
  assert exported["num_nextn_predict_layers"] == 1 and exported["dtype"] == "float32"
  assert (exported["bos_token_id"], exported["eos_token_id"]) == (0, 1)
  assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 1
  assert (out / "tokenizer.json").read_bytes() == (SAVED / "tokenizer.json").read_bytes()
  assert source["num_hidden_layers"] == exported["num_hidden_layers"]

  tokens = np.load(SAVED / "tokens.npy")
  cfg, params, ours = _run_logits(root, tokens)
  # The run trained: its logits left the starting point (transformers' own, committed).
  start = np.load(SAVED / "logits.npy")
  assert np.abs(ours - start).max() > 10 * TOLERANCE
  # The exported directory holds exactly the run's parameters, MTP module included.
  loaded_cfg, loaded = hf.load(out)
  assert loaded_cfg.num_mtp_layers == 1
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(params),
                          jax.tree.leaves(loaded)):
    np.testing.assert_array_equal(np.asarray(x), y, err_msg=str(path))
  theirs = np.asarray(model.forward(loaded_cfg, loaded, tokens))
  assert np.abs(ours - theirs).max() <= TOLERANCE

  python = torch_reference.torch_python()  # the c2jax-side checks above have passed
  np.save(root / "tokens.npy", tokens)
  done = subprocess.run([python, str(ROOT / "tools" / "fixtures" / "hf_logits.py"), str(out),
                         str(root / "tokens.npy"), str(root / "hf_logits.npy")],
                        capture_output=True, text=True, timeout=300,
                        env=torch_reference.clean_env(), check=False)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  live = np.load(root / "hf_logits.npy")
  diff = np.abs(live - ours).max()
  print(f"live transformers vs c2jax: max |diff| = {diff:.3g}")
  assert diff <= TOLERANCE, f"max |transformers(export) - c2jax| = {diff:.3g}"


@pytest.mark.slow
def test_export_errors_name_the_fix(run, tmp_path):
  from c2jax.hf import export
  root, _, _ = run
  with pytest.raises(export.ExportError, match=r"--step 7 is not in .*steps are \[2\]"):
    export.export_run(root / "run", tmp_path / "a", step=7)
  with pytest.raises(export.ExportError, match="not a c2jax run directory"):
    export.export_run(SAVED, tmp_path / "b")
  with pytest.raises(FileExistsError, match="already holds safetensors"):
    export.export_run(root / "run", root / "out")


def test_orbax_restore_fallback_writes_the_same_tensors(run, tmp_path, monkeypatch):
  """Leaves are read straight from tensorstore; without that layout, through orbax."""
  from c2jax.hf import export, safetensors_io

  root, _, _ = run
  monkeypatch.setattr(export, "_open_array", lambda spec: None)
  export.export_run(root / "run", tmp_path / "via_orbax", dtype="float32", log=print)
  fast = safetensors_io.SafetensorsReader(root / "out")
  slow = safetensors_io.SafetensorsReader(tmp_path / "via_orbax")
  assert fast.names() == slow.names()
  for name in fast.names():
    np.testing.assert_array_equal(fast.read(name), slow.read(name), err_msg=name)


def test_export_requantises_to_the_released_fp8_layout(run, tmp_path):
  """--quantize fp8: DeepSeek's block-scaled layout, which loads back (dequantised) within
  FP8's rounding of the plain export."""
  from c2jax.hf import export, quant_formats, quantized, safetensors_io

  root, _, _ = run
  summary = export.export_run(root / "run", tmp_path / "fp8", dtype="float32",
                              quantize="fp8")
  assert summary["quantize"] == "fp8"
  config = json.loads((tmp_path / "fp8" / "config.json").read_text())
  assert config["quantization_config"]["quant_method"] == "fp8"
  stored = safetensors_io.SafetensorsReader(tmp_path / "fp8")
  scaled = [n for n in stored.names() if n.endswith("weight_scale_inv")]
  assert scaled and all(stored.tensors[n[:-len("_scale_inv")]].dtype == quant_formats.FP8
                        for n in scaled)
  _, plain = hf.load(root / "out")
  _, fp8 = hf.load(tmp_path / "fp8")
  for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(plain),
                               jax.tree_util.tree_leaves_with_path(fp8)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.abs(a - b).max() <= np.abs(a).max() / 8, jax.tree_util.keystr(path)
  assert quantized.scheme_from_config(config) == quantized.export_scheme("fp8")


@pytest.mark.parametrize("case", ["deepseek_v3_grouped_yarn", "qwen3_moe_norm"])
def test_a_run_without_hf_origin_exports_its_params_and_tokenizer(case, tmp_path):
  """Both HF architectures; the tokenizer is the run's own (config.data.tokenizer_file)."""
  from c2jax.hf import export
  from c2jax.train.step import TrainState
  cfg_model, params = hf.load(ROOT / "tests" / "fixtures" / "hf" / case)
  tokenizer = tmp_path / "tok.json"
  tokenizer.write_text((SAVED / "tokenizer.json").read_text())
  ckpt = checkpoint_lib.Checkpointer(tmp_path / "run" / "checkpoints", async_save=False)
  job = {"model": cfg_model.to_dict(), "init_from": "",
         "data": {"tokenizer_file": str(tokenizer)}}
  ckpt.save(3, TrainState(step=np.int32(3), params=params, opt_state=None), {}, job,
            force=True)
  ckpt.close()
  summary = export.export_run(tmp_path / "run", tmp_path / "out", dtype="bf16")
  assert summary["files"] == ["tokenizer.json", "tokenizer_config.json"]
  assert (tmp_path / "out" / "tokenizer.json").read_text() == tokenizer.read_text()
  out_cfg, out_params = hf.load(tmp_path / "out")
  assert out_cfg.param_dtype == "bfloat16" and out_cfg.rope.to_dict() == cfg_model.rope.to_dict()
  import ml_dtypes
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(out_params)):
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(np.asarray(x).astype(ml_dtypes.bfloat16), y)
