"""A finished run as serve, eval, the base evals and tools use it: `load_run`.

    run = run_loading.load_run("runs/tiny/sft")   # model config, params, tokenizer, step

PATH is either
  - a c2jax run directory (`config.json` + `checkpoints/`, as pretrain / sft / rl write),
    local or any URL c2jax.storage reads (gs://, s3://, file://): the model config is
    rebuilt from config.json's `model` section (defaults, then the saved values,
    validated: a run saved by an older c2jax or a hand-edited config.json fails naming
    the key), the tokenizer from its `data` section (the run's tokenizer_file directly,
    else the same cached corpus + tokenizer the run trained with, built again if this
    machine has no cache), and the newest parameters through
    init_params.restore_init_params, the one restore path every later phase uses, with
    its checks that every parameter exists with the configured shape; `step` is the
    checkpoint step (the policy version); or
  - a local HF model directory (`config.json` with `model_type`, safetensors,
    `tokenizer.json`) through c2jax.hf (released FP8 / INT4 layouts dequantised), step 0.

keep_mtp: keep the multi-token-prediction modules (for speculative decoding). Without it
they are left out (scoring and greedy decoding do not use them) and model.num_mtp_layers
is 0. With it, a drafter the checkpoint does not hold is left out too: an untrained
drafter would only slow decoding.

weights_quant: the engine.weights_quant of the engine that will hold the weights. An HF
directory whose routed experts are stored in that format (DeepSeek-V3 fp8, Kimi-K2.5
int4) gives them as stored (WeightQuant leaves, c2jax.hf.load), not dequantised.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import ml_collections

from c2jax import config as configlib
from c2jax import data, hf, model, storage
from c2jax.data.tokenizer import Tokenizer
from c2jax.model import config as model_config
from c2jax.model import mtp as mtp_lib
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import init_params


@dataclasses.dataclass(frozen=True)
class LoadedRun:
  cfg: ml_collections.ConfigDict  # the model config
  params: dict
  tokenizer: Tokenizer
  directory: object  # pathlib.Path, or etils.epath.Path for a URL (c2jax.storage)
  step: int  # the checkpoint step (policy version); 0 for an HF directory


def load_run(path: str | os.PathLike, *, keep_mtp: bool = False, progress: bool = False,
             flag: str = "run directory", weights_quant: str = "none") -> LoadedRun:
  """The model config, newest parameters, tokenizer and step of the run (or local HF
  directory) at `path`; `flag` names where the path came from in errors."""
  directory = storage.orbax_path(path, flag)
  config_file = directory / "config.json"
  if not config_file.is_file():
    raise FileNotFoundError(
        f"{flag} {path}: no config.json there; pass a c2jax run directory (the --workdir "
        "of c2jax pretrain / sft / rl, holding config.json and checkpoints/) or an HF "
        "model directory.")
  job = json.loads(config_file.read_text())
  if (directory / "checkpoints").is_dir():
    return _load_c2jax_run(directory, job, keep_mtp=keep_mtp, progress=progress)
  if "model_type" in job:
    return _load_hf(storage.require_local(path, flag, "an HF model directory"),
                    keep_mtp=keep_mtp, weights_quant=weights_quant)
  raise ValueError(f"{flag} {path}: config.json is neither a c2jax run's (no "
                   "checkpoints/ beside it) nor an HF model's (no model_type).")


def _check_vocab(where, tokenizer: Tokenizer, cfg) -> None:
  if tokenizer.vocab_size > cfg.vocab_size:
    raise ValueError(f"{where}: the tokenizer has {tokenizer.vocab_size} tokens (chat "
                     f"markers included) but the model's vocab_size is {cfg.vocab_size}; "
                     "ids past the embedding would be out of range. Load a model trained "
                     "with this tokenizer.")


def _load_c2jax_run(directory, job: dict, *, keep_mtp: bool, progress: bool) -> LoadedRun:
  missing = [k for k in ("model", "data") if not isinstance(job.get(k), dict)]
  if missing:
    raise ValueError(f"{directory}/config.json has no {missing} section(s); it is not the "
                     "config of a c2jax pretrain / sft / rl run (RL runs keep theirs under "
                     "their policy phase).")
  cfg = model_config.defaults()
  configlib.apply_overrides(cfg, job["model"])
  if not keep_mtp:
    cfg.num_mtp_layers = 0
  model_config.validate(cfg)
  data_cfg = data.default_config()
  configlib.apply_overrides(data_cfg, job["data"], "data.")
  if data_cfg.tokenizer_file:  # no need to (re)build the run's corpus to read it
    tokenizer = Tokenizer.load(pathlib.Path(data_cfg.tokenizer_file).expanduser())
  else:
    tokenizer = data.prepare_from_config(data_cfg, progress=progress).tokenizer()
  _check_vocab(directory, tokenizer, cfg)
  abstract = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  restore_cfg = ml_collections.ConfigDict({"init_from": str(directory), "model": cfg})
  params = init_params.restore_init_params(restore_cfg, abstract)
  # A drafter the checkpoint did not hold is still abstract: leave it out.
  params = {k: v for k, v in params.items()
            if not any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(v))}
  checkpointer = checkpoint_lib.Checkpointer(directory / "checkpoints", async_save=False)
  try:
    step = checkpointer.steps()[-1]
  finally:
    checkpointer.close()
  return LoadedRun(cfg, params, tokenizer, directory, int(step))


def _load_hf(directory: pathlib.Path, *, keep_mtp: bool, weights_quant: str) -> LoadedRun:
  tokenizer_file = directory / "tokenizer.json"
  if not tokenizer_file.is_file():
    raise FileNotFoundError(f"{directory} is an HF directory without tokenizer.json; copy "
                            "the model's tokenizer.json there.")
  tokenizer = Tokenizer.load(tokenizer_file)
  cfg, params = hf.load(directory, weights_quant=weights_quant)
  _check_vocab(directory, tokenizer, cfg)
  if not keep_mtp:
    cfg.num_mtp_layers = 0
    params = {k: v for k, v in params.items() if k != mtp_lib.PARAMS_KEY}
  return LoadedRun(cfg, jax.tree.map(jnp.asarray, params), tokenizer, directory, 0)
