"""Any phase's checkpoint (pretrain, longctx, sft, mtp, rl) as an HF model directory.

    summary = export.export_run("runs/x/sft", "out_hf", step=None, dtype="bfloat16")

Writes config.json (DeepSeek-V3 layout, MTP layers included as extra decoder layers, or
Qwen3-MoE), generation_config.json, safetensors shards with their index, and the run's
tokenizer files. Parameters are read one leaf at a time (from the step's tensorstore
arrays, or an orbax partial restore per leaf) and written out leaf by leaf, so the host
holds one leaf plus one HF tensor, not the model. Where the run began from an HF directory
(followed through `init_from`, also across phases), that directory's config.json supplies the fields c2jax does not model
(token ids, ...) and its tokenizer / chat template files are copied; otherwise the run's
own tokenizer (config.data) is written as tokenizer.json.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from c2jax import storage
from c2jax.hf import checkpoint as converted_lib
from c2jax.hf import config as hf_config
from c2jax.hf import convert
from c2jax.hf import names
from c2jax.hf import sources

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "float32": "float32",
          "fp32": "float32"}
_SIDE_FILES_SKIPPED = ("config.json", "model.safetensors.index.json")
_MAX_CHAIN = 16  # init_from links followed looking for the HF origin


class ExportError(ValueError):
  """A run that cannot be exported; the message says what to do."""


def _checkpoints_dir(run):
  """RUN/checkpoints or RUN itself (pathlib or etils.epath: c2jax.storage.orbax_path)."""
  return run / "checkpoints" if (run / "checkpoints").is_dir() else run


class _LeafSource:
  """convert.Source over an orbax step: restores one leaf whole, serves its slices, and
  drops it when the next leaf is asked for (the export plan walks leaf by leaf)."""

  def __init__(self, manager: ocp.CheckpointManager, step: int, abstract: dict,
               dtype: np.dtype | None):
    self._manager, self._step, self._abstract, self._dtype = manager, step, abstract, dtype
    self._path, self._leaf = None, None

  def _get(self, path: names.Path):
    node = self._abstract
    for key in path:
      if not isinstance(node, dict) or key not in node:
        raise ExportError(f"the checkpoint has no parameter {'/'.join(path)}; its saved "
                          "model config does not match its parameters.")
      node = node[key]
    return node

  def dtype(self, path):
    return self._dtype or np.dtype(self._get(path).dtype)

  def read(self, path, index):
    if path != self._path:
      self._path, self._leaf = None, None  # free the previous leaf before reading the next
      self._path, self._leaf = path, self._read_leaf(path)
    part = self._leaf[index]
    return part.astype(self._dtype) if self._dtype is not None else part

  def _read_leaf(self, path) -> np.ndarray:
    """The whole leaf, read straight from the step's tensorstore arrays (one copy in
    memory, about twice orbax's speed); through orbax when that layout is not found."""
    location = self._manager.directory / str(self._step) / "state"
    spec = {"driver": "zarr", "kvstore": {"driver": "ocdbt",
                                          "base": storage.kvstore_spec(location),
                                          "path": "params." + ".".join(path) + "/"}}
    array = _open_array(spec)
    expected = tuple(self._get(path).shape)
    if array is not None and tuple(array.shape) == expected:
      return array.read().result()
    one = {"params": _nest({path: self._get(path)})}
    restored = self._manager.restore(self._step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
            item=one, partial_restore=True,
            restore_args=ocp.checkpoint_utils.construct_restore_args(one))))
    leaf = restored["state"]["params"]
    for key in path:
      leaf = leaf[key]
    return np.asarray(leaf)


def _is_run(path) -> bool:
  try:
    return sources.detect(path) == "run"
  except sources.SourceError:
    return False


def _open_array(spec: dict):
  try:
    return ts.open(spec, open=True).result()
  except (ValueError, RuntimeError):  # not there: another orbax layout
    return None


def _nest(flat: dict) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


def _saved_params(ckpt_dir, step: int) -> dict:
  """Abstract params (ShapeDtypeStructs on the default device) from orbax metadata."""
  handler = ocp.PyTreeCheckpointHandler()
  try:
    tree = handler.metadata(ckpt_dir / str(step) / "state").tree
  finally:
    handler.close()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(
      lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device),
      tree["params"], is_leaf=lambda m: hasattr(m, "shape"))


def _origin(job: dict, log) -> tuple[dict | None, pathlib.Path | None]:
  """(HF config.json, directory of tokenizer & co.) of the HF directory the run started
  from, following init_from through earlier phases (runs may be URLs); (None, None) if
  it began fresh."""
  seen = 0
  while job and job.get("init_from") and seen < _MAX_CHAIN:
    seen += 1
    source = job["init_from"]
    try:
      kind = sources.detect(source)
    except sources.SourceError as err:
      log(f"export: init_from {source!r} cannot be read ({err}); the exported config.json "
          "is built from the run's model config alone and no source tokenizer files are "
          "copied")
      return None, None
    if kind == "hf":
      path = sources.local_dir(source)
      return json.loads((path / "config.json").read_text()), path
    if kind == "converted":
      reader = converted_lib.CheckpointReader(sources.local_dir(source))
      return reader.hf_source, reader.files_dir if reader.files_dir.is_dir() else None
    config = storage.orbax_path(source) / "config.json"
    job = json.loads(config.read_text()) if config.exists() else None
  return None, None


def _copy_side_files(src: pathlib.Path, out: pathlib.Path) -> list[str]:
  copied = []
  for item in sorted(src.iterdir()):
    if (item.is_file() and not item.name.endswith(".safetensors")
        and item.name not in _SIDE_FILES_SKIPPED and not (out / item.name).exists()):
      shutil.copy2(item, out / item.name)
      copied.append(item.name)
  return copied


def _write_run_tokenizer(job: dict, out: pathlib.Path, log) -> list[str]:
  """The run's own tokenizer.json: config.data.tokenizer_file, or the BPE c2jax trained
  for the run (found in the data cache the run used)."""
  data_cfg = job.get("data") or {}
  path = data_cfg.get("tokenizer_file")
  if not path:
    from c2jax import data  # the data stack is only needed here
    try:
      path = data.prepare_from_config(ml_collections.ConfigDict(data_cfg),
                                      progress=False).tokenizer_path
    except Exception as err:  # pylint: disable=broad-except
      log(f"export: the run's tokenizer cannot be found ({type(err).__name__}: {err}); "
          "copy tokenizer.json into the export yourself")
      return []
  path = pathlib.Path(path).expanduser()
  if not path.exists():
    log(f"export: the run's tokenizer {path} is gone; copy tokenizer.json into the "
        "export yourself")
    return []
  shutil.copy2(path, out / "tokenizer.json")
  (out / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length":
       int(job["model"]["max_position"])}, indent=2) + "\n")
  return ["tokenizer.json", "tokenizer_config.json"]


def _generation_config(hf: dict) -> dict:
  text, _ = hf_config.text_config(hf)
  out = {key: text[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")
         if text.get(key) is not None}
  return {**out, "_from_model_config": True}


def export_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
               step: int | None = None, dtype: str | None = None,
               quantize: str | None = None,
               max_shard_bytes: int = convert.DEFAULT_SHARD_BYTES, log=print) -> dict:
  """Writes the run's parameters at `step` (newest if None) as an HF directory;
  `quantize` ('fp8', 'fp8-ue8m0', 'int4': c2jax.hf.quantized.EXPORT_SCHEMES) writes a
  released model's quantised layout instead of plain weights. `run_dir` is a local path
  or any URL c2jax.storage reads (gs://, s3://, file://); `out_dir` a local directory
  (or a file:// URL)."""
  try:
    run = storage.orbax_path(run_dir, "--run")
    out = storage.require_local(out_dir, "--to-hf", "an HF export")
  except storage.StorageLocationError as err:
    raise ExportError(str(err)) from None
  if dtype is not None and dtype not in DTYPES:
    raise ExportError(f"--dtype {dtype!r} is not one of {sorted(DTYPES)}.")
  ckpt_dir = _checkpoints_dir(run)
  if not _is_run(run):
    raise ExportError(f"{run} is not a c2jax run directory (no checkpoints/); pass the "
                      "workdir of a pretrain / sft / rl run.")
  manager = ocp.CheckpointManager(ckpt_dir, item_names=("state", "data", "config"))
  try:
    steps = sorted(manager.all_steps())
    if not steps:
      raise ExportError(f"{ckpt_dir} holds no finished checkpoint; train the run first.")
    if step is None:
      step = steps[-1]
    elif step not in steps:
      raise ExportError(f"--step {step} is not in {ckpt_dir}; its steps are {steps}.")
    job = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    job = dict(job["config"] or {})
    if "model" not in job and isinstance(job.get("config"), dict):
      job = job["config"]  # the RL learner nests its job config one level down
    if "model" not in job:
      saved = run / "config.json"
      if not saved.exists():
        raise ExportError(f"step {step} of {ckpt_dir} stores no config and {run} has no "
                          "config.json; export needs the model config.")
      job = json.loads(saved.read_text())
    cfg = hf_config.config_from_dict(job["model"])
    abstract = _saved_params(ckpt_dir, step)
    if dtype is not None:
      cfg.param_dtype = DTYPES[dtype]
    else:
      stored = {str(np.dtype(x.dtype)) for x in jax.tree.leaves(abstract)}
      if len(stored) == 1:
        cfg.param_dtype = stored.pop()
    base, side_dir = _origin(job, log)
    source = _LeafSource(manager, step, abstract,
                         np.dtype(DTYPES[dtype]) if dtype else None)
    expected = {leaf.path: leaf.shape for leaf in names.leaves(cfg)}
    saved_paths = {tuple(k.key for k in p): tuple(x.shape) for p, x in
                   jax.tree_util.tree_leaves_with_path(abstract)}
    if saved_paths != expected:
      odd = sorted("/".join(p) for p in set(saved_paths) ^ set(expected))
      raise ExportError(f"the parameters of step {step} do not match its model config "
                        f"(e.g. {odd[:3]}); was the checkpoint written by another model?")
    convert.write_hf(source, cfg, out, max_shard_bytes, base, leaf_major=True,
                     quantize=quantize)
  finally:
    manager.close()
  hf = json.loads((out / "config.json").read_text())
  (out / "generation_config.json").write_text(
      json.dumps(_generation_config(base or hf), indent=2) + "\n")
  files = _copy_side_files(side_dir, out) if side_dir else _write_run_tokenizer(job, out, log)
  shards = sorted(out.glob("*.safetensors"))
  return {"step": step, "shards": len(shards), "bytes": sum(p.stat().st_size for p in shards),
          "dtype": cfg.param_dtype, "quantize": quantize, "mtp_layers": cfg.num_mtp_layers,
          "files": files}
