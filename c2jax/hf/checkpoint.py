"""The c2jax converted-checkpoint format (CKPT): written and read slice by slice.

    CKPT/
      params/<leaf path>/     one tensorstore zarr3 array per parameter leaf, chunked so
                              that one chunk is one layer (or one expert of one layer):
                              conversion writes and reads one HF tensor's worth at a time
      hf_files/               the source's non-weight files (tokenizer, generation config)
      hf_source_config.json   the source HF config.json (fields c2jax does not model)
      c2jax_model.json        the c2jax model config; written last, so its presence means
                              the conversion finished

Leaf paths follow the c2jax parameter tree (e.g. `moe_layers/moe/experts/gate_proj`).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import ml_collections
import numpy as np
import tensorstore as ts

from c2jax.hf import config as hf_config
from c2jax.hf import names

CONFIG_FILE = "c2jax_model.json"
SOURCE_FILE = "hf_source_config.json"
PARAMS_DIR = "params"
FILES_DIR = "hf_files"


def _spec(root: pathlib.Path, path: names.Path) -> dict:
  return {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root.joinpath(*path))}}


class CheckpointWriter:
  """A sink for conversion: `create` each leaf, `write` slices, then `finalize`."""

  def __init__(self, ckpt_dir: str | os.PathLike):
    self.dir = pathlib.Path(ckpt_dir)
    if (self.dir / CONFIG_FILE).exists():
      raise FileExistsError(f"{self.dir} already holds a c2jax checkpoint; choose a new "
                            "--out directory or delete it first.")
    shutil.rmtree(self.dir / PARAMS_DIR, ignore_errors=True)  # leftovers of a failed run
    self._arrays: dict[names.Path, ts.TensorStore] = {}

  def create(self, path: names.Path, shape: tuple[int, ...], dtype: np.dtype,
             slice_rank: int) -> None:
    chunk = [1] * (len(shape) - slice_rank) + list(shape[len(shape) - slice_rank:])
    spec = _spec(self.dir / PARAMS_DIR, path)
    spec.update(create=True, delete_existing=True, metadata={
        "shape": list(shape), "data_type": np.dtype(dtype).name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}}})
    self._arrays[path] = ts.open(spec).result()

  def write(self, path: names.Path, index: tuple[int, ...], array: np.ndarray) -> None:
    self._arrays[path][index].write(array).result()

  def finalize(self, cfg: ml_collections.ConfigDict, hf_source: dict | None,
               hf_dir: pathlib.Path | None) -> None:
    if hf_dir is not None:
      _copy_side_files(hf_dir, self.dir / FILES_DIR)
    if hf_source is not None:
      (self.dir / SOURCE_FILE).write_text(json.dumps(hf_source, indent=2) + "\n")
    (self.dir / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")


def _copy_side_files(src: pathlib.Path, dst: pathlib.Path) -> None:
  """Tokenizer & co. travel with the weights; weights and configs are rewritten instead."""
  dst.mkdir(parents=True, exist_ok=True)
  for item in src.iterdir():
    if item.is_file() and not item.name.endswith(".safetensors") and item.name not in (
        "config.json", "model.safetensors.index.json"):
      shutil.copy2(item, dst / item.name)


class CheckpointReader:
  """A source for conversion: reads one slice of one leaf at a time."""

  def __init__(self, ckpt_dir: str | os.PathLike):
    self.dir = pathlib.Path(ckpt_dir)
    config_path = self.dir / CONFIG_FILE
    if not config_path.exists():
      raise FileNotFoundError(f"{self.dir} is not a complete c2jax checkpoint (no "
                              f"{CONFIG_FILE}); convert it again with `c2jax convert "
                              "--from-hf DIR --out CKPT`.")
    self.cfg = hf_config.config_from_dict(json.loads(config_path.read_text()))
    source = self.dir / SOURCE_FILE
    self.hf_source = json.loads(source.read_text()) if source.exists() else None
    self.files_dir = self.dir / FILES_DIR
    self._arrays: dict[names.Path, ts.TensorStore] = {}

  def _array(self, path: names.Path) -> ts.TensorStore:
    if path not in self._arrays:
      spec = _spec(self.dir / PARAMS_DIR, path)
      spec["open"] = True
      self._arrays[path] = ts.open(spec).result()
    return self._arrays[path]

  def dtype(self, path: names.Path) -> np.dtype:
    return np.dtype(self._array(path).dtype.numpy_dtype)

  def read(self, path: names.Path, index: tuple[int, ...]) -> np.ndarray:
    return self._array(path)[index].read().result()


def load_checkpoint(ckpt_dir: str | os.PathLike) -> tuple[ml_collections.ConfigDict, dict]:
  """(cfg, params) of a CKPT directory, params as a nested dict of numpy arrays."""
  reader = CheckpointReader(ckpt_dir)
  params: dict = {}
  for leaf in names.leaves(reader.cfg):
    node = params
    for key in leaf.path[:-1]:
      node = node.setdefault(key, {})
    node[leaf.path[-1]] = reader.read(leaf.path, ())
  return reader.cfg, params
