"""Every reader of a finished run takes it as a URL (c2jax.storage): init_from (model
config and parameters), `c2jax export`, `c2jax serve` loading, the base-model evals and
`c2jax eval`'s engine policy, each given `file://` URLs of an SFT-style and an RL-style run
(the RL learner nests its job config one level down in the checkpoint). HF directories are
local only: a remote URL is an error saying so, before anything is read."""

import json
import pathlib

import jax
import ml_collections
import numpy as np
import pytest

from c2jax import data, model, storage
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.eval import engine_policy
from c2jax.eval import base as eval_base
from c2jax.hf import export, sources
from c2jax.model import variants
from c2jax.serve import loading
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import init_params, model_source

SOURCES = {"one": {"a.py": "def a(x):\n  return x + 1\n"}, "two": {"b.py": "B = [1, 2]\n"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """{'sft': dir, 'rl': dir} of one tiny model's parameters (the newest step, 2, wins)."""
  root = tmp_path_factory.mktemp("url_runs")
  for name, files in SOURCES.items():
    for rel, text in files.items():
      (root / "src" / name).mkdir(parents=True, exist_ok=True)
      (root / "src" / name / rel).write_text(text)
  texts = [t for files in SOURCES.values() for t in files.values()] * 20
  tokenizer_lib.train_bpe(texts, 300).save(root / "tokenizer.json")
  cfg = variants.get("tiny")
  data_cfg = data.default_config()
  data_cfg.update(dict(cache_dir=str(root / "cache"), sources=[f"{root}/src/*"],
                       heldout_repositories=["two"], heldout_fraction=0.0,
                       tokenizer_file=str(root / "tokenizer.json")))
  job = {"model": cfg.to_dict(), "data": data_cfg.to_dict(), "init_from": ""}
  init = jax.jit(lambda key: model.init(cfg, key))
  runs = {}
  for kind in ("sft", "rl"):
    workdir = root / kind
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps(job))
    saved_config = {"config": job} if kind == "rl" else job
    ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", async_save=False)
    for step in (1, 2):
      params = init(jax.random.key(step))
      ckpt.save(step, {"step": np.int32(step), "params": params}, {}, saved_config,
                force=True)
    ckpt.close()
    runs[kind] = workdir
  return runs, cfg, params


def _url(path: pathlib.Path) -> str:
  return f"file://{path}"


def _assert_same(got, want):
  jax.tree.map(np.testing.assert_array_equal, got, want)


@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_init_from_a_file_url(runs, kind, tmp_path, monkeypatch):
  dirs, cfg, params = runs
  monkeypatch.chdir(tmp_path)  # a mangled URL would appear here as ./file:/...
  url = _url(dirs[kind])
  assert sources.detect(url) == "run"
  source, where = model_source.source_model(url)
  assert source.to_dict() == cfg.to_dict() and str(dirs[kind]) in where
  phase = ml_collections.ConfigDict({"init_from": url, "model": variants.get("tiny"),
                                     "model_changes": ()})
  assert model_source.resolve(phase, log=False).model.to_dict() == cfg.to_dict()
  fresh = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  _assert_same(init_params.restore_init_params(phase, fresh), params)
  assert not list(tmp_path.iterdir())


def test_export_from_a_file_url_matches_the_local_path(runs, tmp_path):
  dirs, _, _ = runs
  summary = export.export_run(_url(dirs["rl"]), _url(tmp_path / "from_url"), dtype="float32")
  local = export.export_run(dirs["rl"], tmp_path / "from_path", dtype="float32")
  assert summary == local and summary["step"] == 2
  for name in ("config.json", "model.safetensors.index.json", "tokenizer.json"):
    assert ((tmp_path / "from_url" / name).read_bytes()
            == (tmp_path / "from_path" / name).read_bytes()), name
  from_url, from_path = (sources.HFSource(tmp_path / d, log=lambda _: None)
                         for d in ("from_url", "from_path"))
  for path, shape in from_path.shapes.items():
    index = tuple(slice(0, n) for n in shape)
    np.testing.assert_array_equal(from_url.read(path, index), from_path.read(path, index))


def test_serve_and_evals_load_a_run_from_a_file_url(runs):
  dirs, cfg, params = runs
  url = _url(dirs["rl"]) + "/"
  served = loading.load(url)
  assert (served.name, served.version) == ("rl", 2)
  _assert_same(served.params, params)
  loaded = eval_base.load_run(url)
  _assert_same(loaded.params, {k: v for k, v in params.items() if k != "mtp_layers"})
  np.testing.assert_array_equal(loaded.tokenizer.encode("def a(x):"),
                                served.tokenizer.encode("def a(x):"))
  model_cfg, policy_params, _ = engine_policy.load_run(_url(dirs["sft"]))
  assert model_cfg.to_dict() == cfg.to_dict()
  _assert_same(policy_params, params)


def test_local_only_readers_refuse_remote_urls_naming_them(tmp_path):
  with pytest.raises(sources.SourceError, match="read from local disk only"):
    sources.HFSource("gs://bucket/hf_model")
  with pytest.raises(sources.SourceError, match="local disk only"):
    sources.ConvertedSource("s3://bucket/converted")
  with pytest.raises(export.ExportError, match="--to-hf = 'gs://bucket/out'.*local disk"):
    export.export_run(tmp_path, "gs://bucket/out")
  with pytest.raises(storage.StorageLocationError, match="--model.*scheme 'http'"):
    loading.load("http://host/run")
