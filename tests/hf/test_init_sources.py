"""`init_from` reads a c2jax run, an HF directory or `c2jax convert` output, detected by
what is on disk, streamed shard by shard into the run's shardings; real-world HF variation
(MTP declared but absent, tied embeddings, extra or missing tensors) loads with one log
line or fails naming the tensors."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from c2jax import hf, model
from c2jax.hf import safetensors_io, sources
from c2jax.train import init_params

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "deepseek_v3_grouped_yarn"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _cfg(init_from, model_cfg):
  return ml_collections.ConfigDict({"init_from": str(init_from), "model": model_cfg})


def _abstract(model_cfg):
  return jax.eval_shape(lambda: model.init(model_cfg, jax.random.key(0)))


def _assert_equal_trees(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for path, x in jax.tree_util.tree_leaves_with_path(got):
    y = want
    for key in path:
      y = y[key.key]
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))


def _rewrite(src: pathlib.Path, dst: pathlib.Path, *, drop=(), add=None, config=None):
  """A copy of an HF dir with tensors dropped / added and config.json fields changed."""
  dst.mkdir()
  reader = safetensors_io.SafetensorsReader(src)
  planned = [safetensors_io.PlannedTensor(n, i.dtype, i.shape, lambda n=n: reader.read(n))
             for n, i in reader.tensors.items() if n not in drop]
  for name, array in (add or {}).items():
    planned.append(safetensors_io.PlannedTensor(name, array.dtype, array.shape,
                                                lambda a=array: a))
  safetensors_io.write_sharded(dst, planned, 2**40)
  hf_cfg = json.loads((src / "config.json").read_text())
  hf_cfg.update(config or {})
  (dst / "config.json").write_text(json.dumps(hf_cfg))
  return dst


@pytest.fixture(scope="module")
def reference():
  return hf.load(FIXTURE)


def test_detects_each_kind_and_names_what_it_found(tmp_path, reference):
  assert sources.detect(FIXTURE) == "hf"
  hf.convert_from_hf(FIXTURE, tmp_path / "ckpt")
  assert sources.detect(tmp_path / "ckpt") == "converted"
  (tmp_path / "run" / "checkpoints").mkdir(parents=True)
  assert sources.detect(tmp_path / "run") == "run"
  (tmp_path / "partial").mkdir()
  (tmp_path / "partial" / "config.json").write_text("{}")
  with pytest.raises(sources.SourceError, match=r"none of.*\['config.json'\]"):
    sources.detect(tmp_path / "partial")
  assert sources.model_config(FIXTURE).to_dict() == reference[0].to_dict()


def test_hf_single_file_sharded_and_converted_load_the_same_values(tmp_path, reference):
  cfg_model, want = reference
  hf.save(cfg_model, want, tmp_path / "sharded", max_shard_bytes=64 * 1024)
  assert (tmp_path / "sharded" / safetensors_io.INDEX_FILE).exists()
  assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2
  hf.convert_from_hf(FIXTURE, tmp_path / "ckpt")
  for source in (FIXTURE, tmp_path / "sharded", tmp_path / "ckpt"):
    params = init_params.restore_init_params(_cfg(source, cfg_model), _abstract(cfg_model))
    _assert_equal_trees(params, want)


def test_mtp_declared_but_absent_loads_and_starts_mtp_fresh(tmp_path, reference, capsys):
  cfg_model, want = reference
  saved = _rewrite(FIXTURE, tmp_path / "saved", config={"num_nextn_predict_layers": 1})
  with_mtp = cfg_model.copy_and_resolve_references()
  with_mtp.num_mtp_layers = 1
  fresh = model.init(with_mtp, jax.random.key(3))
  params = init_params.restore_init_params(_cfg(saved, with_mtp), fresh)
  out = capsys.readouterr().out
  assert "declares num_nextn_predict_layers = 1 but stores no MTP tensors" in out
  assert "MTP module(s) start from a fresh initialisation" in out
  _assert_equal_trees(params["mtp_layers"], fresh["mtp_layers"])
  _assert_equal_trees({k: v for k, v in params.items() if k != "mtp_layers"}, want)
  # A run without MTP loads the same directory with nothing to drop.
  params = init_params.restore_init_params(_cfg(saved, cfg_model), _abstract(cfg_model))
  _assert_equal_trees(params, want)


def test_tied_embeddings_start_the_lm_head_as_the_embedding(tmp_path, reference, capsys):
  cfg_model, want = reference
  tied = _rewrite(FIXTURE, tmp_path / "tied", drop=("lm_head.weight",),
                  config={"tie_word_embeddings": True})
  params = init_params.restore_init_params(_cfg(tied, cfg_model), _abstract(cfg_model))
  assert "ties the LM head to the embedding" in capsys.readouterr().out
  np.testing.assert_array_equal(params["lm_head"]["kernel"], want["embed"]["embedding"].T)


def test_extra_and_missing_tensors_are_named(tmp_path, reference):
  cfg_model, _ = reference
  extra = _rewrite(FIXTURE, tmp_path / "extra",
                   add={"model.layers.0.mlp.bias": np.zeros(4, np.float32)})
  with pytest.raises(sources.SourceError, match=r"model\.layers\.0\.mlp\.bias.*Remove them"):
    init_params.restore_init_params(_cfg(extra, cfg_model), _abstract(cfg_model))
  name = "model.layers.2.mlp.experts.5.up_proj.weight"
  missing = _rewrite(FIXTURE, tmp_path / "missing", drop=(name,))
  with pytest.raises(sources.SourceError, match=rf"missing: \['{name}'\].*Finish the download"):
    init_params.restore_init_params(_cfg(missing, cfg_model), _abstract(cfg_model))


def test_a_different_architecture_names_the_parameter(reference):
  cfg_model = reference[0].copy_and_resolve_references()
  cfg_model.moe.intermediate_size = 24
  with pytest.raises(ValueError, match=r"moe_layers/moe/experts/\w+_proj has shape .* \(hf\)"):
    init_params.restore_init_params(_cfg(FIXTURE, cfg_model), _abstract(cfg_model))


_SHARDED_SCRIPT = """
import json, sys
import jax, numpy as np
from c2jax import hf
from c2jax.train import init_params, jobs, loop
cfg = jobs.job_defaults("tiny")
cfg.model, params = hf.load(sys.argv[1])
cfg.data.vocab_size, cfg.train.seq_len = cfg.model.vocab_size, 32
cfg.parallel.mesh.fsdp, cfg.parallel.mesh.expert = 4, 2
cfg.init_from = sys.argv[1]
from c2jax.hf import placement
placement.BLOCK_BYTES = 512  # replicated and sharded leaves also take the block path
rt = loop.build_runtime(cfg)
abstract = loop.abstract_state(rt).params
with rt.scope():
  got = init_params.restore_init_params(cfg, abstract, rt.state_shardings.params)
rows = []
for (path, x), want in zip(jax.tree_util.tree_leaves_with_path(got),
                           jax.tree.leaves(rt.state_shardings.params)):
  ref = params
  for key in path:
    ref = ref[key.key]
  assert x.sharding == want, (path, x.sharding, want)
  np.testing.assert_array_equal(np.asarray(x), ref)
  rows.append(len({d for d in x.sharding.device_set}) == 8 and not x.sharding.is_fully_replicated)
print(json.dumps({"leaves": len(rows), "sharded": sum(rows)}))
"""


def test_eight_devices_get_the_intended_shardings_and_values():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  done = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT, str(FIXTURE)], env=env,
                        capture_output=True, text=True, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads(done.stdout.strip().splitlines()[-1])
  assert summary["leaves"] > 20 and summary["sharded"] > 5, summary


def test_fused_expert_tensors_load_like_per_expert_ones(tmp_path, reference):
  """Some writers store each layer's experts fused ([E, 2F, D] gate+up, [E, D, F] down)."""
  cfg_model, want = reference
  reader = safetensors_io.SafetensorsReader(FIXTURE)
  experts = cfg_model.moe.num_experts
  fused, drop = {}, []
  for layer in range(cfg_model.first_k_dense, cfg_model.num_layers):
    prefix = f"model.layers.{layer}.mlp.experts"
    names = {p: [f"{prefix}.{e}.{p}.weight" for e in range(experts)]
             for p in ("gate_proj", "up_proj", "down_proj")}
    fused[f"{prefix}.gate_up_proj"] = np.stack([np.concatenate(
        [reader.read(g), reader.read(u)]) for g, u in zip(names["gate_proj"], names["up_proj"])])
    fused[f"{prefix}.down_proj"] = np.stack([reader.read(n) for n in names["down_proj"]])
    drop += [n for group in names.values() for n in group]
  fused_dir = _rewrite(FIXTURE, tmp_path / "fused", drop=drop, add=fused)
  params = init_params.restore_init_params(_cfg(fused_dir, cfg_model), _abstract(cfg_model))
  _assert_equal_trees(params, want)


def test_transformers4_config_spelling_and_bf16_weights_load(tmp_path, reference):
  """`rope_scaling` + top-level `rope_theta` + `torch_dtype` (transformers 4) mean what
  `rope_parameters` + `dtype` (transformers 5) do; bf16 tensors cast into the run's dtype."""
  cfg_model, want = reference
  import ml_dtypes
  hf_cfg = json.loads((FIXTURE / "config.json").read_text())
  rope = dict(hf_cfg.pop("rope_parameters"))
  theta = rope.pop("rope_theta")
  rope["type"] = rope.pop("rope_type")
  old = {"rope_scaling": rope, "rope_theta": theta, "torch_dtype": "bfloat16",
         "dtype": None}
  reader = safetensors_io.SafetensorsReader(FIXTURE)
  bf16 = {n: reader.read(n).astype(ml_dtypes.bfloat16) for n in reader.tensors}
  legacy = _rewrite(FIXTURE, tmp_path / "legacy", drop=tuple(bf16), add=bf16, config=old)
  (legacy / "config.json").write_text(json.dumps(
      {k: v for k, v in {**hf_cfg, **old}.items() if v is not None}))
  loaded_cfg = sources.model_config(legacy)
  assert loaded_cfg.rope.to_dict() == cfg_model.rope.to_dict()
  assert loaded_cfg.param_dtype == "bfloat16"
  params = init_params.restore_init_params(_cfg(legacy, cfg_model), _abstract(cfg_model))
  assert params["embed"]["embedding"].dtype == np.float32
  rounded = jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32), want)
  _assert_equal_trees(params, rounded)


def test_large_shards_are_assembled_on_device_block_by_block(tmp_path, reference, monkeypatch):
  from c2jax.hf import placement
  cfg_model, want = reference
  reads = []
  source = sources.HFSource(FIXTURE, log=lambda _: None)
  read = source.read
  monkeypatch.setattr(source, "read", lambda path, index: reads.append(index) or read(path, index))
  monkeypatch.setattr(placement, "BLOCK_BYTES", 1024)
  params = placement.place(source, _abstract(cfg_model))
  _assert_equal_trees(params, want)
  # The expert stacks [layers, experts, ...] were read one layer at a time.
  assert any(index[0] == slice(1, 2) for index in reads)


def test_rl_starts_from_an_hf_directory(reference, tmp_path):
  """The RL learner's starting state (learner_runtime.start): the HF directory's weights,
  placed in the learner runtime's shardings, and the KL reference a copy of them."""
  from c2jax.rl import job
  from c2jax.rl.learner import runtime as learner_runtime
  from c2jax.train import checkpoint as checkpoint_lib
  cfg_model, want = reference
  cfg = job.job_defaults("tiny")
  cfg.model, cfg.init_from, cfg.rl.kl.coef = cfg_model, str(FIXTURE), 0.01
  rt = learner_runtime.build(cfg)
  checkpointer = checkpoint_lib.Checkpointer(tmp_path / "checkpoints", async_save=False)
  try:
    step, state, ref_params, restored = learner_runtime.start(rt, checkpointer)
  finally:
    checkpointer.close()
  assert (step, restored) == (0, None)
  _assert_equal_trees(state.params, want)
  _assert_equal_trees(ref_params, want)


def test_load_and_convert_accept_save_pretrained_output(tmp_path, capsys):
  """hf.load / `c2jax convert` take the directory transformers wrote (MTP declared, absent)."""
  saved = ROOT / "tests" / "fixtures" / "hf_saved" / "deepseek_v3_mtp_declared"
  cfg_model, params = hf.load(saved)
  assert cfg_model.num_mtp_layers == 0 and "mtp_layers" not in params
  assert "stores no MTP tensors" in capsys.readouterr().out
  logits = model.forward(cfg_model, params, np.load(saved / "tokens.npy"))
  assert np.abs(np.asarray(logits) - np.load(saved / "logits.npy")).max() <= 1e-4
  hf.convert_from_hf(saved, tmp_path / "ckpt")
  assert hf.load_checkpoint(tmp_path / "ckpt")[0].num_mtp_layers == 0
