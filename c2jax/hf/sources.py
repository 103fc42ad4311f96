"""What `init_from` points at, told apart by what is on disk, and read leaf slice by slice.

    kind = sources.detect(path)            # 'run' | 'hf' | 'converted'
    where = sources.locate(path)           # kind, path, and a run's orbax steps folder
    source = sources.open_source(path)     # HFSource | ConvertedSource (not for 'run')
    source.shapes                          # c2jax leaf path -> shape it can provide
    source.read(path, index)               # leaf[index] as numpy, index a tuple of slices

A 'run' is a c2jax workdir (orbax steps under checkpoints/), restored by orbax itself
(train/loop.py). An 'hf' directory holds config.json plus safetensors (one file or shards
with model.safetensors.index.json); 'converted' is `c2jax convert --from-hf` output
(c2jax_model.json + one tensorstore array per leaf). Both of the latter are read through
`read(path, index)`, which touches only the HF tensors (or tensorstore chunks) that overlap
`index`: placement.py asks for one device shard at a time, so host memory stays near one
tensor however large the model.

Real-world HF directories vary; each variation loads with one log line or fails before
anything is read with an error naming the tensors and what to do:
  - config.json declares num_nextn_predict_layers but the MTP tensors are absent (what
    transformers' save_pretrained writes): loaded without MTP (`mtp_dropped`);
  - transformers >= 5 `save_pretrained` output, whose experts are fused per layer: read
    under the per-expert names;
  - tie_word_embeddings: the untied c2jax LM head starts as the embedding's transpose;
  - extra or missing tensors are listed by name.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pathlib
import re
from collections.abc import Callable

import ml_collections
import numpy as np

from c2jax import storage
from c2jax.hf import checkpoint
from c2jax.hf import config as hf_config
from c2jax.hf import names
from c2jax.hf import safetensors_io

KINDS = ("run", "hf", "converted")
_SHOWN = 5  # tensor names listed in an error


class SourceError(ValueError):
  """An init_from directory that cannot be loaded; the message says what to do."""


def detect(path: str | os.PathLike) -> str:
  """'run', 'hf' or 'converted', from the files in `path` (a local directory or a URL
  c2jax.storage accepts); SourceError if none matches. Only a run may be remote."""
  try:
    directory = storage.orbax_path(path, "init_from")
  except storage.StorageLocationError as err:
    raise SourceError(str(err)) from None
  if not directory.is_dir():
    raise SourceError(f"init_from = {str(path)!r} is not a directory; pass a c2jax run "
                      "directory, an HF model directory or `c2jax convert` output.")
  if (directory / "checkpoints").is_dir() or _has_orbax_steps(directory):
    return "run"
  if storage.local_path(path) is None:
    raise SourceError(
        f"init_from = {str(path)!r} holds no c2jax run (checkpoints/ with orbax steps); "
        "HF model directories and `c2jax convert` output are read from local disk only: "
        "copy it to a local directory first and pass that path (or a file:// URL).")
  if (directory / checkpoint.CONFIG_FILE).exists():
    return "converted"
  weights = ((directory / safetensors_io.INDEX_FILE).exists()
             or any(directory.glob("*.safetensors")))
  if (directory / "config.json").exists() and weights:
    return "hf"
  found = sorted(p.name for p in directory.iterdir())[:10]
  raise SourceError(
      f"init_from = {str(path)!r} is none of: a c2jax run (checkpoints/ with orbax steps), "
      f"an HF model directory (config.json + *.safetensors or {safetensors_io.INDEX_FILE}), "
      f"a `c2jax convert` output ({checkpoint.CONFIG_FILE}). It holds {found or 'nothing'}"
      "; point init_from at one of those (an HF directory still downloading lacks its "
      "safetensors).")


@dataclasses.dataclass(frozen=True)
class Location:
  """What an init_from path names, decided once (detect) for every reader of it."""
  kind: str  # 'run' | 'hf' | 'converted'
  path: object  # storage.orbax_path(init_from): pathlib.Path, or etils.epath.Path
  steps_dir: object | None  # a run's orbax step folders: RUN/checkpoints or RUN; else None


def locate(path: str | os.PathLike) -> Location:
  """The kind of source at `path` and, for a run, where its checkpoint steps are;
  SourceError as detect's."""
  kind = detect(path)
  directory = storage.orbax_path(path, "init_from")
  steps_dir = None
  if kind == "run":
    steps_dir = directory / "checkpoints" if (directory / "checkpoints").is_dir() else directory
  return Location(kind, directory, steps_dir)


def local_dir(path: str | os.PathLike) -> pathlib.Path:
  """The local directory of an HF or converted source (a path or a file:// URL)."""
  try:
    return storage.require_local(path, "init_from",
                                 "an HF model directory or `c2jax convert` output")
  except storage.StorageLocationError as err:
    raise SourceError(str(err)) from None


def _has_orbax_steps(directory) -> bool:
  return any(p.is_dir() and p.name.isdigit() and (p / "state").is_dir()
             for p in directory.iterdir())


def model_config(path: str | os.PathLike) -> ml_collections.ConfigDict:
  """The c2jax model config stored with any init_from source (what a phase inherits)."""
  kind = detect(path)
  if kind == "run":
    job = storage.orbax_path(path, "init_from") / "config.json"
    if not job.exists():
      raise SourceError(f"{path} has checkpoints but no config.json (the job config a "
                        "c2jax run writes); point init_from at the run's workdir.")
    return hf_config.config_from_dict(_read_json(job)["model"])
  directory = local_dir(path)
  if kind == "hf":  # as declared (MTP layers a checkpoint lacks start fresh), untied head
    hf, _ = open_tensors(directory, _read_json(directory / "config.json"))
    return _declared_config(hf)[0]
  return checkpoint.CheckpointReader(directory).cfg


def _read_json(path) -> dict:
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as err:
    raise SourceError(f"{path} is not valid JSON ({err}); re-download or rewrite it.") from err


def _declared_config(hf: dict):
  """(c2jax config, layout) config.json declares, with c2jax's untied LM head (a tied
  checkpoint's head starts as its embedding)."""
  text, _ = hf_config.text_config(hf)
  return hf_config.from_hf(
      {**hf, "tie_word_embeddings": False} if not hf.get("text_config")
      else {**hf, "text_config": {**text, "tie_word_embeddings": False}})


class HFSource:
  """An HF model directory as c2jax leaves, read by slices of whole HF tensors."""

  kind = "hf"

  def __init__(self, hf_dir: str | os.PathLike, log: Callable[[str], None] = print):
    self.dir = local_dir(hf_dir)
    self.hf, self.reader = open_tensors(self.dir, _read_json(self.dir / "config.json"))
    text, _ = hf_config.text_config(self.hf)
    tied = bool(text.get("tie_word_embeddings", False))
    declared, self.layout = _declared_config(self.hf)
    present = set(self.reader.tensors)
    self.cfg, self.mtp_dropped = stored_config(declared, self.layout, present, self.dir, log)
    leaves = names.leaves(self.cfg, self.layout.prefix)
    head = self.layout.prefix + "lm_head.weight"
    embed = self.layout.prefix + "model.embed_tokens.weight"
    self.tied = tied and head not in present
    if self.tied:  # kernel [D, V] = embedding [V, D] transposed: a 'linear' piece of it
      leaves = [_retarget(leaf, head, embed) for leaf in leaves]
      log(f"init: {self.dir} ties the LM head to the embedding; c2jax's untied LM head "
          "starts as the embedding and trains separately from it")
    self._check(leaves, present)
    self.leaves = {leaf.path: leaf for leaf in leaves}
    self.shapes = {leaf.path: leaf.shape for leaf in leaves}

  def _check(self, leaves: list[names.Leaf], present: set[str]) -> None:
    wanted = {p.hf_name: (leaf, p) for leaf in leaves for p in leaf.pieces}
    missing = sorted(set(wanted) - present, key=_natural)
    if missing:
      raise SourceError(
          f"{self.dir}: {len(missing)} tensor(s) that config.json implies are missing: "
          f"{missing[:_SHOWN]}{' ...' if len(missing) > _SHOWN else ''}. Finish the "
          "download (compare with model.safetensors.index.json) or fix config.json to "
          "describe the checkpoint.")
    copies = names.shared_copies(self.cfg, self.layout.prefix)
    extra = []
    for name in sorted(present - set(wanted) - set(copies), key=_natural):
      if names.skipped_reason(name, self.cfg, self.layout.prefix) is None:
        extra.append(name)
    if extra:
      raise SourceError(
          f"{self.dir}: {len(extra)} tensor(s) have no place in the model config.json "
          f"describes: {extra[:_SHOWN]}{' ...' if len(extra) > _SHOWN else ''}. "
          f"{names.unmapped_error(extra[0])} Remove them, or fix config.json.")
    for name, (leaf, piece) in wanted.items():
      info = self.reader.tensors[name]
      expected = piece.hf_shape(leaf.slice_shape)
      if tuple(info.shape) != tuple(expected):
        raise SourceError(f"{self.dir}: tensor {name!r} has shape {list(info.shape)} but "
                          f"config.json implies {list(expected)}; the config and weights "
                          "come from different models.")

  def stacked_dims(self, path: names.Path) -> int:
    """Leading axes of the leaf that index separate HF tensors (layer, expert)."""
    return len(self.leaves[path].pieces[0].index)

  def read(self, path: names.Path, index: tuple[slice, ...]) -> np.ndarray:
    """leaf[index]: every HF tensor whose slice overlaps `index`, one at a time."""
    leaf = self.leaves[path]
    lead = len(leaf.pieces[0].index)
    by_index = {piece.index: piece for piece in leaf.pieces}
    ranges = [range(*s.indices(n)) for s, n in zip(index[:lead], leaf.shape[:lead])]
    trailing = tuple(index[lead:])
    out = None
    for position in itertools.product(*ranges):
      piece = by_index[position]
      whole = piece.to_leaf(self.reader.read(piece.hf_name), leaf.slice_shape)
      part = whole[trailing]
      if out is None:
        out = np.empty(tuple(len(r) for r in ranges) + part.shape, part.dtype)
      out[tuple(p - r.start for p, r in zip(position, ranges))] = part
      del whole, part
    return out


class ConvertedSource:
  """`c2jax convert` output: tensorstore reads exactly the requested slice."""

  kind = "converted"

  def __init__(self, ckpt_dir: str | os.PathLike, log: Callable[[str], None] = print):
    del log
    self.dir = local_dir(ckpt_dir)
    self.reader = checkpoint.CheckpointReader(self.dir)
    self.cfg = self.reader.cfg
    self.mtp_dropped = False
    self._leaves = {leaf.path: leaf for leaf in names.leaves(self.cfg)}
    self.shapes = {path: leaf.shape for path, leaf in self._leaves.items()}

  def stacked_dims(self, path: names.Path) -> int:
    return len(self._leaves[path].pieces[0].index)  # stored chunked one slice per chunk

  def read(self, path: names.Path, index: tuple[slice, ...]) -> np.ndarray:
    return np.asarray(self.reader.read(path, tuple(index)))


_FUSED = re.compile(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)")


class _UnfusedExperts:
  """transformers >= 5 saves each layer's experts fused (`experts.gate_up_proj` [E, 2F, D],
  `experts.down_proj` [E, D, F]); this reader shows them under the per-expert names of
  released checkpoints (names.py), slicing the fused tensor it read last."""

  def __init__(self, reader):
    self.dir, self._reader = reader.dir, reader
    self.tensors, self._virtual = {}, {}
    self._cached = (None, None)
    for name, info in reader.tensors.items():
      match = _FUSED.fullmatch(name)
      if not match:
        self.tensors[name] = info
        continue
      prefix, kind = match.groups()
      experts, rows, cols = info.shape
      parts = (("gate_proj", 0), ("up_proj", 1)) if kind == "gate_up_proj" else (
          ("down_proj", None),)
      for e in range(experts):
        for proj, half in parts:
          shape = (rows // 2, cols) if half is not None else (rows, cols)
          legacy = f"{prefix}.{e}.{proj}.weight"
          self.tensors[legacy] = dataclasses.replace(
              info, name=legacy, shape=shape,
              nbytes=int(np.prod(shape)) * info.dtype.itemsize)
          self._virtual[legacy] = (name, e, half)

  def read(self, name: str) -> np.ndarray:
    if name not in self._virtual:
      return self._reader.read(name)
    fused, expert, half = self._virtual[name]
    if self._cached[0] != fused:
      self._cached = (None, None)
      self._cached = (fused, self._reader.read(fused))
    block = self._cached[1][expert]
    if half is not None:
      rows = block.shape[0] // 2
      block = block[half * rows:(half + 1) * rows]
    return np.ascontiguousarray(block)


def open_source(path: str | os.PathLike, log: Callable[[str], None] = print):
  kind = detect(path)
  if kind == "hf":
    return HFSource(path, log)
  if kind == "converted":
    return ConvertedSource(path, log)
  raise SourceError(f"{path} is a c2jax run; restore it with orbax (train/loop.py).")


def open_tensors(hf_dir: pathlib.Path, hf: dict, reader=None):
  """(config.json as the model reads it, reader of its tensors) of an HF directory.

  Released quantised formats (DeepSeek FP8 blocks, compressed-tensors INT4) are read
  through c2jax.hf.quantized: the reader lists each weight once under its plain name and
  float shape and dequantises it on read, and the config loses its quantization_config.
  Fused expert tensors are shown under per-expert names. Either way a reader has `.dir`,
  `.tensors` (name -> safetensors_io.TensorInfo) and `.read(name) -> np.ndarray`.
  """
  from c2jax.hf import quantized  # pylint: disable=g-import-not-at-top

  hf, reader = quantized.open_hf(pathlib.Path(hf_dir), hf, reader)
  if any(_FUSED.fullmatch(name) for name in reader.tensors):
    reader = _UnfusedExperts(reader)
  return hf, reader


def stored_config(cfg, layout: hf_config.Layout, present: set[str], where,
                  log: Callable[[str], None] = print):
  """(cfg, mtp_dropped): the model the stored tensors describe. When config.json declares
  MTP layers (num_nextn_predict_layers) but none of their tensors are stored, as
  transformers' save_pretrained writes, the model without them and one log line."""
  trimmed, dropped = _without_absent_mtp(cfg, layout, present)
  if dropped:
    log(f"{where} declares num_nextn_predict_layers = {cfg.num_mtp_layers} but "
        "stores no MTP tensors (as transformers' save_pretrained writes); loading the "
        "model without MTP modules")
  return trimmed, dropped


def _without_absent_mtp(cfg, layout: hf_config.Layout, present: set[str]):
  """(cfg, dropped); some but not all MTP tensors present is left to the missing-tensor
  error."""
  if not cfg.num_mtp_layers:
    return cfg, False
  first = cfg.num_layers
  mtp_names = {p.hf_name for leaf in names.leaves(cfg, layout.prefix) for p in leaf.pieces
               if _layer_of(p.hf_name, layout.prefix) >= first}
  if mtp_names & present:
    return cfg, False
  trimmed = cfg.copy_and_resolve_references()
  trimmed.num_mtp_layers = 0
  return trimmed, True


def _layer_of(hf_name: str, prefix: str) -> int:
  parts = hf_name.removeprefix(prefix).split(".")
  return int(parts[2]) if parts[:2] == ["model", "layers"] else -1


def _retarget(leaf: names.Leaf, old: str, new: str) -> names.Leaf:
  pieces = tuple(names.Piece(new, p.leaf, p.index, p.kind, p.in_dims) if p.hf_name == old
                 else p for p in leaf.pieces)
  return names.Leaf(leaf.path, leaf.shape, pieces)


def _natural(name: str) -> list:
  return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in name.split(".")]
