"""c2jax.storage: local paths and object-store URLs through one helper, and the two
libraries that write them (orbax checkpoints, tensorstore weights) given a file:// URL."""

import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import storage
from c2jax.rollout import weights as weights_lib
from c2jax.train import checkpoint as checkpoint_lib


def test_local_paths_become_absolute_and_urls_are_kept(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert storage.resolve("ckpt") == str(tmp_path / "ckpt")
  assert storage.resolve("gs://bucket/run/") == "gs://bucket/run"
  assert storage.resolve("s3://bucket/a//b") == "s3://bucket/a//b"
  assert storage.resolve("file:///data/./run/") == "file:///data/run"
  assert storage.resolve("file://localhost/data") == "file:///data"
  assert storage.is_url("gs://b/x") and not storage.is_url("/data/gs:/b")


def test_join_and_local_path():
  assert storage.join("gs://bucket/run", "weights", "from-step-000003") == (
      "gs://bucket/run/weights/from-step-000003")
  assert storage.join("/abs/run/", "ckpt") == "/abs/run/ckpt"
  assert storage.join("file:///abs", "w/") == "file:///abs/w"
  assert storage.local_path("file:///abs/run") == pathlib.Path("/abs/run")
  assert storage.local_path("gs://bucket/run") is None
  assert str(storage.orbax_path("gs://bucket/run")) == "gs://bucket/run"
  assert storage.kvstore_spec("file:///abs/run") == {"driver": "file", "path": "/abs/run/"}
  assert storage.kvstore_spec("s3://bucket/run") == "s3://bucket/run/"


@pytest.mark.parametrize("bad, says", [
    ("http://host/x", "scheme 'http'"),
    ("file://data/run", "three slashes"),
    ("gs:///run", "names no bucket"),
    ("gs://bucket/run?x=1", "takes no"),
    ("", "is empty"),
])
def test_bad_locations_are_named_errors(bad, says):
  with pytest.raises(storage.StorageLocationError, match=says) as err:
    storage.resolve(bad, "learner.checkpoint_dir")
  if bad:
    assert "learner.checkpoint_dir" in str(err.value)


def test_weights_and_checkpoints_round_trip_through_a_file_url(tmp_path):
  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones((3,), jnp.bfloat16)}
  url = f"file://{tmp_path}/remote/weights"
  publisher = weights_lib.WeightPublisher(url, full_every=4)
  publisher.publish(params, 0, full=True)
  publisher.publish(jax_add(params, 1.0), 1)
  loaded, version = weights_lib.WeightSubscriber(url).poll()
  assert version == 1
  np.testing.assert_array_equal(loaded["w"], np.arange(6.0).reshape(2, 3) + 1)
  assert (tmp_path / "remote" / "weights" / "manifests").is_dir()
  # A URL must not be mangled into <cwd>/file:/... by pathlib.
  assert not list(pathlib.Path.cwd().glob("file:*"))

  ckpt_url = f"file://{tmp_path}/remote/ckpt"
  checkpointer = checkpoint_lib.Checkpointer(ckpt_url, async_save=False, every=1)
  checkpointer.save(2, {"params": params}, {}, {"note": "x"}, force=True)
  checkpointer.close()
  assert (tmp_path / "remote" / "ckpt" / "2").is_dir()
  reader = checkpoint_lib.Checkpointer(ckpt_url, async_save=False)
  step, state, _ = reader.restore_latest(checkpoint_lib.abstract_like({"params": params}))
  assert step == 2
  np.testing.assert_array_equal(state["params"]["w"], params["w"])
  reader.close()
  storage.remove_tree(ckpt_url)
  assert not (tmp_path / "remote" / "ckpt").exists()


def jax_add(tree, value):
  return {k: v + jnp.asarray(value, v.dtype) for k, v in tree.items()}


def test_children_and_remove_tree_on_a_url(tmp_path):
  url = f"file://{tmp_path}/root"
  weights_lib.WeightPublisher(storage.join(url, "from-step-000000")).publish(
      {"w": jnp.zeros((2,))}, 0, full=True)
  (tmp_path / "root" / "other").mkdir()
  assert storage.children(url) == ["from-step-000000", "other"]
  assert storage.children(f"file://{tmp_path}/missing") == []
  storage.remove_tree(storage.join(url, "from-step-000000"))
  assert storage.children(url) == ["other"]


def test_the_rl_job_refuses_a_bad_location_naming_its_key():
  from c2jax import config as configlib  # pylint: disable=g-import-not-at-top
  from c2jax.rl import job  # pylint: disable=g-import-not-at-top

  cfg = configlib.load_config_file("configs/rl.py", "test")
  cfg.actors.weights_dir = "gs://bucket/run/weights"
  cfg.learner.checkpoint_dir = "file:///abs/ckpt"
  job.validate(cfg)
  cfg.learner.checkpoint_dir = "ftp://host/ckpt"
  with pytest.raises(configlib.ConfigError, match="learner.checkpoint_dir.*'ftp'"):
    job.validate(cfg)


def test_a_resumed_learner_gets_a_fresh_weights_folder_and_keeps_others(tmp_path):
  import ml_collections  # pylint: disable=g-import-not-at-top

  from c2jax.rl.actors import rollouts  # pylint: disable=g-import-not-at-top

  root = tmp_path / "bucket"
  (root / "from-step-000000" / "manifests").mkdir(parents=True)
  (root / "another-run").mkdir()
  cfg = ml_collections.ConfigDict({"actors": {"weights_dir": f"file://{root}/"}})
  dirs = rollouts.RunDirs(tmp_path / "run")
  assert rollouts.fresh_weights_dir(cfg, dirs, 3) == f"file://{root}/from-step-000003"
  assert sorted(p.name for p in root.iterdir()) == ["another-run"]
  cfg.actors.weights_dir = ""
  assert rollouts.fresh_weights_dir(cfg, dirs, 0) == str(tmp_path / "run/weights/from-step-000000")
