"""load_run rebuilds a run's model, newest parameters and tokenizer from its directory."""

import json

import jax
import numpy as np
import pytest

from c2jax import data, model
from c2jax.eval import base
from c2jax.eval.base import perplexity
from c2jax.model import variants
from c2jax.train import checkpoint as checkpoint_lib

from evalbase_testlib import write_repo

SOURCES = {"one": {"a.py": "def a():\n  return 1\n"}, "two": {"b.py": "B = 2\n"}}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tok):
  root = tmp_path_factory.mktemp("run")
  for name, files in SOURCES.items():
    write_repo(root / "src" / name, files)
  tok.save(root / "tokenizer.json")
  cfg = variants.get("tiny", num_mtp_layers=1)
  data_cfg = data.default_config()
  data_cfg.update(dict(cache_dir=str(root / "cache"), sources=[f"{root}/src/*"],
                       heldout_repositories=["two"], heldout_fraction=0.0,
                       tokenizer_file=str(root / "tokenizer.json")))
  workdir = root / "workdir"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(
      {"model": cfg.to_dict(), "data": data_cfg.to_dict(), "init_from": ""}))
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", async_save=False)
  init = jax.jit(lambda key: model.init(cfg, key))
  for step, seed in ((1, 1), (2, 2)):  # the newest step must win
    params = init(jax.random.key(seed))
    ckpt.save(step, {"step": np.int32(step), "params": params}, {}, {}, force=True)
  ckpt.close()
  return workdir, cfg, params


def test_load_run_restores_newest_params(run_dir, tok, repo):
  workdir, cfg, params = run_dir
  loaded = base.load_run(workdir)
  assert loaded.cfg.num_mtp_layers == 0 and "mtp_layers" not in loaded.params
  expected = {k: v for k, v in params.items() if k != "mtp_layers"}
  jax.tree.map(np.testing.assert_array_equal, loaded.params, expected)
  np.testing.assert_array_equal(loaded.tokenizer.encode("def f(x):"), tok.encode("def f(x):"))
  with_mtp = base.load_run(workdir, keep_mtp=True)
  jax.tree.map(np.testing.assert_array_equal, with_mtp.params["mtp_layers"],
               params["mtp_layers"])
  # The eval runs on what was loaded: same numbers as the in-memory parameters.
  from_run = perplexity.codebase_perplexity(loaded.cfg, loaded.params, loaded.tokenizer, repo,
                                            window=32, stride=16, batch_size=2)
  direct = perplexity.codebase_perplexity(cfg, params, tok, repo, window=32, stride=16,
                                          batch_size=2)
  assert from_run.nll == pytest.approx(direct.nll, rel=1e-6)


def test_load_run_errors_name_the_problem(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    base.load_run(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps({"rl": {}}))
  with pytest.raises(ValueError, match="model"):
    base.load_run(tmp_path)
