"""`init_params.initial_params` across MTP configurations: a config with MTP modules starts from a
checkpoint without them (trunk restored, MTP fresh), a checkpoint's MTP modules are
dropped by a config without them, and a depth mismatch is an error naming the parameter."""

import jax
import numpy as np
import pytest

from c2jax.model import mtp
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import init_params, jobs, loop


def _job(num_mtp_layers: int, init_from: str = ""):
  cfg = jobs.job_defaults("tiny")
  cfg.model.vocab_size = 64
  cfg.model.num_mtp_layers = num_mtp_layers
  cfg.data.vocab_size = 64
  cfg.init_from = init_from
  return cfg


def _fresh(num_mtp_layers: int, init_from: str = ""):
  rt = loop.build_runtime(_job(num_mtp_layers, init_from))
  return rt, loop.init_state(rt)


def _save(workdir, num_mtp_layers: int):
  """A checkpoint whose parameters all differ from a fresh init (fresh + 1)."""
  _, state = _fresh(num_mtp_layers)
  state = state.replace(params=jax.tree.map(lambda x: x + 1.0, state.params))
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", async_save=False)
  ckpt.save(7, state, {}, {}, force=True)
  ckpt.close()
  return state.params


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """Two tiny checkpoints: one without MTP modules, one with a single depth."""
  root = tmp_path_factory.mktemp("mtp_init")
  return {depths: (root / f"mtp{depths}", _save(root / f"mtp{depths}", depths))
          for depths in (0, 1)}


def test_mtp_starts_fresh_on_a_checkpoint_without_it(saved, capsys):
  workdir, saved_params = saved[0]
  rt, fresh = _fresh(1, str(workdir))
  state = init_params.initial_params(rt, fresh)
  trunk = {k: v for k, v in state.params.items() if k != mtp.PARAMS_KEY}
  _assert_trees_equal(trunk, saved_params)
  _assert_trees_equal(state.params[mtp.PARAMS_KEY], fresh.params[mtp.PARAMS_KEY])
  out = capsys.readouterr().out
  assert "step 7" in out and "start from a fresh initialisation" in out


def test_a_config_without_mtp_drops_the_checkpoints(saved, capsys):
  workdir, saved_params = saved[1]
  rt, fresh = _fresh(0, str(workdir))
  state = init_params.initial_params(rt, fresh)
  _assert_trees_equal(state.params,
                      {k: v for k, v in saved_params.items() if k != mtp.PARAMS_KEY})
  assert f"dropping the checkpoint's '{mtp.PARAMS_KEY}'" in capsys.readouterr().out


def test_matching_mtp_modules_are_restored(saved):
  workdir, saved_params = saved[1]
  rt, fresh = _fresh(1, str(workdir))
  _assert_trees_equal(init_params.initial_params(rt, fresh).params, saved_params)


def test_a_different_mtp_depth_is_an_error_naming_the_parameter(saved):
  workdir, _ = saved[1]
  rt, fresh = _fresh(2, str(workdir))
  with pytest.raises(ValueError, match=r"mtp_layers/.* has shape \(1, .*num_mtp_layers"):
    init_params.initial_params(rt, fresh)


@pytest.mark.slow
def test_mtp_config_trains_the_module_alone_on_a_pretrain_checkpoint(tmp_path, data_cache):
  """`c2jax pretrain --config=configs/mtp.py:tiny` from a pretrain run: fresh MTP module,
  the trunk in its checkpoint is exactly the pretrain run's, the MTP metrics are logged."""
  import json

  from c2jax import config as configlib
  from c2jax import model
  from train_testlib import REPO, run_job

  pretrain, mtp_run = tmp_path / "pretrain", tmp_path / "mtp"
  run_job("pretrain", "configs/pretrain.py:tiny", pretrain, data_cache,
          "--config.train.steps=2", "--config.train.eval_every=0")
  result = run_job("pretrain", "configs/mtp.py:tiny", mtp_run, data_cache,
                   "--config.train.steps=3", f"--config.init_from={pretrain}")
  assert "MTP module(s) start from a fresh initialisation" in result.stdout
  rows = [json.loads(line) for line in (mtp_run / "metrics.jsonl").read_text().splitlines()]
  assert [row["step"] for row in rows if "mtp0/agree" in row] == [1, 2, 3]
  cfg = configlib.load_config_file(REPO / "configs/mtp.py", "tiny")
  shapes = jax.eval_shape(lambda: model.init(cfg.model, jax.random.key(0)))
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
                          shapes)
  trunk = {k: v for k, v in abstract.items() if k != mtp.PARAMS_KEY}

  def restore(workdir, tree):
    ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", async_save=False)
    try:
      return ckpt.restore_params(None, tree)
    finally:
      ckpt.close()

  after = restore(mtp_run, abstract)
  _assert_trees_equal({k: v for k, v in after.items() if k != mtp.PARAMS_KEY},
                      restore(pretrain, trunk))
