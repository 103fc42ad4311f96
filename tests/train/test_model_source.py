"""A phase's model config comes from what init_from points at (c2jax/train/model_source.py):
a tiny c2jax run, an HF directory, a converted checkpoint; errors before anything compiles."""

import json
import pathlib

import jax
import numpy as np
import pytest

from c2jax import config as configlib
from c2jax import model as model_lib
from c2jax.hf import checkpoint as hf_checkpoint
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import init_params, jobs, loop, model_source

REPO = pathlib.Path(__file__).resolve().parents[2]
HF_FIXTURE = REPO / "tests/fixtures/hf/deepseek_v3_grouped_yarn"


def _longctx_job():
  """A tiny long-context job as configs/longctx.py makes it (YaRN x8 over 128 tokens)."""
  cfg = jobs.job_defaults("tiny")
  cfg.model.vocab_size = cfg.data.vocab_size = 64
  cfg.model.rope.scaling = "yarn"
  cfg.model.rope.factor = 8.0
  cfg.model.rope.original_max_position = 128
  cfg.model.rope.mscale_all_dim = 1.0
  return cfg


@pytest.fixture(scope="module")
def yarn_run(tmp_path_factory):
  """A c2jax run directory whose checkpoint (step 3) holds a YaRN tiny model."""
  workdir = tmp_path_factory.mktemp("yarn_run")
  cfg = _longctx_job()
  rt = loop.build_runtime(cfg)
  state = loop.init_state(rt)
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", async_save=False)
  ckpt.save(3, state, {}, cfg.to_dict(), force=True)
  ckpt.close()
  return workdir, state.params


def _rl_config(init_from):
  cfg = configlib.load_config_file(REPO / "configs/rl.py", "tiny")
  cfg.init_from = str(init_from)
  return cfg


def test_rl_inherits_the_yarn_of_the_run_it_starts_from(yarn_run, capsys):
  workdir, saved = yarn_run
  cfg = _rl_config(workdir)
  assert cfg.model.rope.scaling == "none"  # the config file itself says tiny
  resolved = model_source.resolve(cfg)
  assert resolved.model.rope.scaling == "yarn" and resolved.model.rope.factor == 8.0
  assert resolved.model.vocab_size == 64
  assert "rope.scaling='yarn'" in capsys.readouterr().out
  assert cfg.model.rope.scaling == "none"  # resolve returns a copy
  # The inherited config restores the run's parameters exactly.
  fresh = jax.eval_shape(lambda: model_lib.init(resolved.model, jax.random.key(0)))
  restored = init_params.restore_init_params(resolved, fresh)
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_checkpoints_folder_works_as_well(yarn_run):
  workdir, _ = yarn_run
  model, where = model_source.source_model(str(workdir / "checkpoints"))
  assert model.rope.scaling == "yarn" and "checkpoints" in where


def test_an_override_fails_before_anything_compiles(yarn_run, tmp_path):
  workdir, _ = yarn_run
  cfg = _longctx_job()
  cfg.init_from = str(workdir)
  cfg.model.rope.factor = 4.0
  with pytest.raises(configlib.ConfigError) as err:
    loop.train(cfg, tmp_path / "next")
  assert err.value.key == "model.rope.factor"
  assert "is 4.0 in this config but 8.0 in the run" in str(err.value)
  assert not (tmp_path / "next" / "checkpoints").exists()
  cfg.model_changes = ("rope.factor",)
  assert model_source.resolve(cfg, log=False).model.rope.factor == 4.0


def test_an_hf_directory_supplies_its_config_json():
  model, where = model_source.source_model(str(HF_FIXTURE))
  hf = json.loads((HF_FIXTURE / "config.json").read_text())
  assert (model.hidden_size, model.moe.n_group, model.moe.routed_scaling_factor) == (
      hf["hidden_size"], hf["n_group"], hf["routed_scaling_factor"])
  assert model.rope.scaling == "yarn" and "HF model" in where
  cfg = jobs.job_defaults("tiny")
  cfg.init_from = str(HF_FIXTURE)
  cfg.data.vocab_size = hf["vocab_size"]
  cfg.model.moe_impl = "ragged"
  resolved = model_source.resolve(cfg, log=False)
  assert resolved.model.hidden_size == hf["hidden_size"]
  assert resolved.model.moe_impl == "ragged"  # free keys stay the phase's
  jobs.validate(resolved)


def test_a_converted_checkpoint_supplies_its_model_json(tmp_path):
  cfg = _longctx_job()
  (tmp_path / hf_checkpoint.CONFIG_FILE).write_text(json.dumps(cfg.model.to_dict()))
  model, where = model_source.source_model(str(tmp_path))
  assert model.rope.factor == 8.0 and "converted" in where


def test_a_checkpoint_without_a_model_config_keeps_the_phase_model(tmp_path, capsys):
  ckpt = checkpoint_lib.Checkpointer(tmp_path / "checkpoints", async_save=False)
  ckpt.save(1, {"x": np.zeros(2, np.float32)}, {}, {}, force=True)
  ckpt.close()
  cfg = jobs.job_defaults("tiny")
  cfg.init_from = str(tmp_path)
  assert model_source.resolve(cfg).model.to_dict() == cfg.model.to_dict()
  assert "records no model config" in capsys.readouterr().out


@pytest.mark.parametrize("make, match", [
    (lambda root: root / "missing", "is not a directory"),
    (lambda root: root, "is none of: a c2jax run"),
])
def test_bad_init_from_is_named(tmp_path, make, match):
  with pytest.raises(configlib.ConfigError, match=match) as err:
    model_source.source_model(str(make(tmp_path)))
  assert err.value.key == "init_from"


def test_the_pipeline_chain_is_checked_before_any_stage_runs(tmp_path):
  cfg = configlib.load_config_file(REPO / "configs/pipeline.py", "tiny")
  stages = ["pretrain", "longctx", "sft"]
  for previous, stage in zip(stages, stages[1:]):
    cfg[stage].init_from = str(tmp_path / previous)  # nothing there yet: not read
  resolved = model_source.check_chain([(stage, cfg[stage]) for stage in stages])
  assert [r.model.rope.scaling for r in resolved] == ["none", "yarn", "yarn"]
  cfg.sft.model.moe.routed_scaling_factor = 2.5
  with pytest.raises(configlib.ConfigError) as err:
    model_source.check_chain([(stage, cfg[stage]) for stage in stages])
  assert err.value.key == "sft.model.moe.routed_scaling_factor"
  assert "is 2.5 in this config but 1.0 in the previous stage" in str(err.value)


def _files(root: pathlib.Path) -> dict:
  return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in root.rglob("*")}


@pytest.mark.parametrize("key, value, saved", [
    ("num_layers", 3, 2), ("rope.factor", 4.0, 8.0), ("dtype", "bfloat16", "float32")])
def test_resuming_with_a_changed_architecture_key_names_it_and_touches_nothing(
    yarn_run, key, value, saved):
  workdir, _ = yarn_run
  cfg = _longctx_job()
  assert configlib.get(cfg.model, key) == saved
  *parents, last = key.split(".")
  node = cfg.model
  for part in parents:
    node = node[part]
  node[last] = value
  before = _files(workdir)
  compiles = []
  listener = lambda event, duration, **kwargs: compiles.append(event)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    with pytest.raises(configlib.ConfigError) as err:
      loop.train(cfg, workdir)  # the same workdir: a resume
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert err.value.key == f"model.{key}"
  assert f"is {value!r} in this config but {saved!r} in the checkpoint" in str(err.value)
  assert not [event for event in compiles if "compile" in event], compiles
  assert _files(workdir) == before  # no checkpoint (nor config.json) read or changed


def test_resuming_with_changed_implementation_keys_restores(yarn_run):
  workdir, saved = yarn_run
  cfg = _longctx_job()
  cfg.model.remat, cfg.model.moe_impl, cfg.model.scan_unroll = "full", "ragged", 2
  model_source.check_resume(cfg, workdir / "checkpoints")
  rt = loop.build_runtime(cfg)
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", async_save=False)
  try:
    step, state, _ = ckpt.restore_latest(loop.abstract_state(rt))
  finally:
    ckpt.close()
  assert step == 3
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
