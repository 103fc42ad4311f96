"""HF checkpoints <-> c2jax parameters, in memory (`load`/`save`) or streaming to disk.

Both directions walk the table in `names.leaves(cfg)`: an HF tensor is read, transformed
and written into its slice (`_hf_into`), or a slice is read and written out as an HF
tensor (`_hf_plan`). At no point is more than one tensor (plus its transformed copy) held
by the converter, so `convert_from_hf` / `convert_to_hf` handle checkpoints larger than
RAM; `load` / `save` use the same walk with an in-memory sink / source. The MTP layers'
copies of the shared embedding / LM head are compared with the originals on the way in
(a warning if they differ) and written out again from the shared leaf.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import warnings
from collections.abc import Callable
from typing import Protocol

import ml_collections
import numpy as np

from c2jax.hf import checkpoint
from c2jax.hf import config as hf_config
from c2jax.hf import names
from c2jax.hf import quantized
from c2jax.hf import safetensors_io
from c2jax.hf import sources
from c2jax.model import moe

DEFAULT_SHARD_BYTES = 5 * 2**30  # HF's usual shard size


class Sink(Protocol):
  def create(self, path: names.Path, shape: tuple[int, ...], dtype: np.dtype,
             slice_rank: int) -> None: ...
  def write(self, path: names.Path, index: tuple[int, ...], array: np.ndarray) -> None: ...


class Source(Protocol):
  def dtype(self, path: names.Path) -> np.dtype: ...
  def read(self, path: names.Path, index: tuple[int, ...]) -> np.ndarray: ...


class _MemorySink:
  def __init__(self):
    self.params: dict = {}

  def create(self, path, shape, dtype, slice_rank):
    self.put(path, np.empty(shape, dtype))

  def put(self, path, value):
    node = self.params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value

  def write(self, path, index, array):
    _get(self.params, path)[index] = array


class _MemorySource:
  def __init__(self, params: dict):
    self.params = params

  def dtype(self, path):
    return np.dtype(_get(self.params, path).dtype)

  def read(self, path, index):
    return np.asarray(_get(self.params, path)[index])


def _get(tree: dict, path: names.Path):
  node = tree
  for key in path:
    if key not in node:
      raise KeyError(f"params have no leaf {'/'.join(path)} (at {key!r}); the params do "
                     "not match the model config.")
    node = node[key]
  return node


def _paths(tree: dict, prefix: names.Path = ()) -> set[names.Path]:
  out = set()
  for key, value in tree.items():
    out |= _paths(value, prefix + (key,)) if isinstance(value, dict) else {prefix + (key,)}
  return out


def _read_hf_config(hf_dir: pathlib.Path) -> dict:
  path = hf_dir / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{hf_dir} has no config.json; pass an HF model directory.")
  return json.loads(path.read_text())


def _hf_into(reader: safetensors_io.SafetensorsReader, cfg, layout: hf_config.Layout,
             sink: Sink, held: frozenset[names.Path] = frozenset()
             ) -> list[tuple[str, str]]:
  """Streams every HF tensor into its leaf slice; returns the (name, reason) skipped.
  Leaves in `held` (read as stored by _held_experts) are checked but not written."""
  leaves = names.leaves(cfg, layout.prefix)
  pieces = {p.hf_name: (leaf, p) for leaf in leaves for p in leaf.pieces}
  missing = [name for name in pieces if name not in reader.tensors]
  if missing:
    raise ValueError(f"{reader.dir}: {len(missing)} tensors the config.json implies are "
                     f"missing, e.g. {missing[:3]}; is the checkpoint complete?")
  copies = names.shared_copies(cfg, layout.prefix)
  skipped = []
  for name, info in reader.tensors.items():  # all checks before anything is written
    if name in copies:
      main = reader.tensors[copies[name]]
      if (info.shape, info.dtype) != (main.shape, main.dtype):
        raise ValueError(f"{reader.dir}: tensor {name!r} should copy {copies[name]!r} but "
                         f"has shape {list(info.shape)} / {info.dtype}, not "
                         f"{list(main.shape)} / {main.dtype}.")
      continue
    if name not in pieces:
      reason = names.skipped_reason(name, cfg, layout.prefix)
      if reason is None:
        raise ValueError(f"{reader.dir}: {names.unmapped_error(name)}")
      skipped.append((name, reason))
      continue
    leaf, piece = pieces[name]
    expected = piece.hf_shape(leaf.slice_shape)
    if info.shape != expected:
      raise ValueError(f"{reader.dir}: tensor {name!r} has shape {list(info.shape)}, the "
                       f"config.json implies {list(expected)}.")
  for leaf in leaves:
    if leaf.path in held:
      continue
    dtypes = {reader.tensors[p.hf_name].dtype for p in leaf.pieces}
    if len(dtypes) != 1:
      raise ValueError(f"{reader.dir}: the tensors of {'/'.join(leaf.path)} mix dtypes "
                       f"{sorted(map(str, dtypes))}; cast them to one dtype first.")
    sink.create(leaf.path, leaf.shape, dtypes.pop(), len(leaf.slice_shape))
  for name in reader.tensors:  # on-disk order: each shard is read front to back
    if name not in pieces or pieces[name][0].path in held:
      continue
    leaf, piece = pieces[name]
    sink.write(leaf.path, piece.index, piece.to_leaf(reader.read(name), leaf.slice_shape))
  for copy, main in copies.items():
    if copy in reader.tensors and not np.array_equal(reader.read(copy), reader.read(main)):
      warnings.warn(f"{reader.dir}: {copy!r} differs from {main!r}, which it should copy; "
                    f"c2jax shares one tensor and uses {main!r} (the MTP layer will see "
                    "the main model's values).", stacklevel=3)
  return skipped


def _hf_plan(source: Source, cfg, leaf_major: bool = False
             ) -> list[safetensors_io.PlannedTensor]:
  """The HF tensors of cfg's model, each produced from its slice: in canonical (layer)
  order, or grouped leaf by leaf (`leaf_major`) for sources that load a leaf at a time."""
  plan = []
  for leaf in names.leaves(cfg):
    dtype = source.dtype(leaf.path)
    for piece in leaf.pieces:
      def produce(piece=piece, leaf=leaf):
        return piece.to_hf(source.read(leaf.path, piece.index))
      plan.append(safetensors_io.PlannedTensor(
          piece.hf_name, dtype, piece.hf_shape(leaf.slice_shape), produce))
  by_name = {t.name: t for t in plan}
  for copy, main in names.shared_copies(cfg).items():  # DeepSeek-V3 stores these twice
    plan.append(dataclasses.replace(by_name[main], name=copy))
  return plan if leaf_major else sorted(plan, key=lambda t: _natural_key(t.name))


def _natural_key(name: str) -> list:
  """model.layers.2 before model.layers.10; experts likewise."""
  return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in name.split(".")]


def load(path: str | os.PathLike, weights_quant: str = "none",
         log: Callable[[str], None] = print) -> tuple[ml_collections.ConfigDict, dict]:
  """(validated c2jax config, params) of an HF directory; params are numpy arrays.

  Quantised checkpoints (FP8 blocks, INT4 packed) are dequantised into their model dtype,
  except, with `weights_quant` (an inference engine's engine.weights_quant), the routed
  experts stored in that very format: those come as kernels.weight_quant.WeightQuant
  leaves holding the stored values and scales (see _held_experts).
  """
  hf_dir = pathlib.Path(path)
  hf, reader = sources.open_tensors(hf_dir, _read_hf_config(hf_dir))
  cfg, layout = hf_config.from_hf(hf)
  cfg, _ = sources.stored_config(cfg, layout, set(reader.tensors), hf_dir)
  held = _held_experts(reader, cfg, layout, weights_quant, log)
  sink = _MemorySink()
  _hf_into(reader, cfg, layout, sink, frozenset(held))
  for leaf_path, weight in held.items():
    sink.put(leaf_path, weight)
  return cfg, sink.params


def _held_experts(reader, cfg, layout: hf_config.Layout, weights_quant: str,
                  log: Callable[[str], None]) -> dict:
  """{leaf path: WeightQuant} of the routed experts that an engine holding
  `weights_quant` can keep exactly as the checkpoint stores them: DeepSeek-V3's fp8
  128x128 blocks under 'fp8', Kimi-K2.5's int4 groups of 32 under 'int4' (its scales are
  amax / 7.5 with values down to -8, which the engine's own quantisation, amax / 7, would
  not reproduce). Values and scales are transposed to the engine's [..., K, N], never
  dequantised. A leaf whose stored format or block is not the engine's (another bit
  width, another group size, a ragged block) is left to be dequantised and quantised
  again by the engine, which one log line says."""
  if weights_quant == "none" or not isinstance(reader, quantized.DequantizingReader):
    return {}
  from c2jax_kernels.weight_quant import formats as weight_quant  # pylint: disable=g-import-not-at-top

  scheme = weight_quant.get_scheme(weights_quant)
  held, refused = {}, {}
  for leaf in names.leaves(cfg, layout.prefix):
    if not moe.is_routed_expert(leaf.path):
      continue
    k, n = leaf.slice_shape
    forms = {reader.held_as(piece.hf_name) for piece in leaf.pieces}
    what = "/".join(leaf.path)
    form = forms.pop() if len(forms) == 1 else None
    if len(forms) > 0 or form is None:
      refused[what] = ("its experts are stored in different formats" if forms else
                       "stored unquantised or in a format no engine holds")
      continue
    if form[0] != weights_quant:
      refused[what] = f"stored as {form[0]}"
      continue
    block = (form[1][1], form[1][0])  # [out, in] -> the engine's [K, N]
    try:
      ours = weight_quant.block_of(scheme, k, n, what)
    except ValueError as err:
      refused[what] = str(err)
      continue
    if block != ours:
      refused[what] = f"stored blocks {block}, the engine's {ours}"
      continue
    values = scales = None
    for piece in leaf.pieces:
      stored = reader.read_stored(piece.hf_name)
      if values is None:
        values = np.empty(leaf.shape, stored.values.dtype)
        scales = np.empty(leaf.shape[:-2] + (k // block[0], n // block[1]), np.float32)
      values[piece.index] = stored.values.T
      scales[piece.index] = stored.scales.T
    held[leaf.path] = weight_quant.WeightQuant(values, scales, weights_quant, block)
  if refused:
    first = next(iter(refused))
    log(f"init: {reader.dir}: {len(refused)} routed-expert weight(s) are not stored as "
        f"weights_quant={weights_quant!r} holds them (e.g. {first}: {refused[first]}); "
        "they are dequantised and the engine quantises them again.")
  return held


def save(cfg: ml_collections.ConfigDict, params: dict, path: str | os.PathLike, *,
         max_shard_bytes: int = DEFAULT_SHARD_BYTES, base_config: dict | None = None,
         quantize: str | None = None) -> None:
  """Writes params as an HF directory: config.json + safetensors shards + index.

  `quantize` ('fp8', 'fp8-ue8m0', 'int4'; see quantized.EXPORT_SCHEMES) writes the
  released on-disk format instead of plain weights.
  """
  extra = sorted("/".join(path) for path in _paths(params)
                 - {leaf.path for leaf in names.leaves(cfg)})
  if extra:  # silently dropping trained weights would be worse than failing
    raise ValueError(f"params hold leaves no HF tensor of this config stores: {extra[:5]}.")
  write_hf(_MemorySource(params), cfg, pathlib.Path(path), max_shard_bytes, base_config,
           quantize=quantize)


def write_hf(source: Source, cfg, hf_dir: pathlib.Path, max_shard_bytes: int,
             base_config: dict | None, *, leaf_major: bool = False,
             quantize: str | None = None) -> None:
  config = hf_config.to_hf(cfg, base_config)  # fails before any file is written
  plan = _hf_plan(source, cfg, leaf_major)
  if quantize is not None:
    scheme = quantized.export_scheme(quantize)
    plan = quantized.quantize_plan(plan, scheme)
    config[quantized.FIELD] = scheme.hf_config()
  if any(hf_dir.glob("*.safetensors")):  # mixing shards of two models corrupts both
    raise FileExistsError(f"{hf_dir} already holds safetensors weights; write to a new "
                          "directory.")
  hf_dir.mkdir(parents=True, exist_ok=True)
  safetensors_io.write_sharded(hf_dir, plan, max_shard_bytes)
  (hf_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def convert_from_hf(hf_dir: str | os.PathLike, out_ckpt: str | os.PathLike, *,
                    reader: safetensors_io.SafetensorsReader | None = None) -> dict:
  """Streams an HF directory into a CKPT directory; returns a summary dict."""
  hf_dir = pathlib.Path(hf_dir)
  hf, reader = sources.open_tensors(hf_dir, _read_hf_config(hf_dir), reader)
  cfg, layout = hf_config.from_hf(hf)
  cfg, _ = sources.stored_config(cfg, layout, set(reader.tensors), hf_dir)
  writer = checkpoint.CheckpointWriter(out_ckpt)
  skipped = _hf_into(reader, cfg, layout, writer)
  writer.finalize(cfg, hf, hf_dir)
  converted = [i for n, i in reader.tensors.items() if n not in dict(skipped)]
  return {"tensors": len(converted), "bytes": sum(i.nbytes for i in converted),
          "skipped": len(skipped), "skipped_reasons": sorted({r for _, r in skipped})}


def convert_to_hf(ckpt: str | os.PathLike, hf_dir: str | os.PathLike, *,
                  max_shard_bytes: int = DEFAULT_SHARD_BYTES,
                  source: Source | None = None, quantize: str | None = None) -> dict:
  """Streams a CKPT directory out as an HF directory; returns a summary dict."""
  reader = checkpoint.CheckpointReader(ckpt)
  hf_dir = pathlib.Path(hf_dir)
  write_hf(source or reader, reader.cfg, hf_dir, max_shard_bytes, reader.hf_source,
           quantize=quantize)
  if reader.files_dir.is_dir():
    for item in reader.files_dir.iterdir():
      shutil.copy2(item, hf_dir / item.name)
  shards = sorted(hf_dir.glob("*.safetensors"))
  return {"shards": len(shards), "bytes": sum(p.stat().st_size for p in shards)}
