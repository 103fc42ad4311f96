"""What `c2jax serve --model PATH` loads: model config, parameters, tokenizer, version.

One function, `load`, so that new checkpoint kinds (a converted c2jax CKPT, an HF chat
template) extend it in one place. PATH is either
  - a c2jax run directory (`config.json` + `checkpoints/`, as pretrain / sft / rl write):
    the newest checkpoint's parameters through train.init_params.restore_init_params (the same
    shape checks every phase uses), the run's tokenizer from its data config, and the
    checkpoint step as the policy version; or
  - an HF directory (`config.json` with `model_type` + safetensors + `tokenizer.json`)
    through c2jax.hf.load, policy version 0.
A run may also be given as any URL c2jax.storage reads (gs://, s3://, file://); an HF
directory must be on local disk (a file:// URL is local).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import ml_collections

from c2jax import config as configlib
from c2jax import data, model, storage
from c2jax.model import config as model_config
from c2jax.data.tokenizer import Tokenizer


@dataclasses.dataclass
class Loaded:
  cfg: ml_collections.ConfigDict  # the model config
  params: dict
  tokenizer: Tokenizer
  name: str  # the id /v1/models reports
  version: int  # policy version of the weights (the checkpoint step)


def load(path: str) -> Loaded:
  directory = storage.orbax_path(path, "--model")
  config_file = directory / "config.json"
  if not config_file.is_file():
    raise FileNotFoundError(f"--model {path}: no config.json there; pass a c2jax run "
                            "directory (with checkpoints/) or an HF model directory.")
  config = json.loads(config_file.read_text())
  if (directory / "checkpoints").is_dir():
    return _load_run(directory, config)
  if "model_type" in config:
    return _load_hf(storage.require_local(path, "--model", "an HF model directory"))
  raise ValueError(f"--model {path}: config.json is neither a c2jax run's (no "
                   "checkpoints/ beside it) nor an HF model's (no model_type).")


def _check_vocab(directory, tokenizer: Tokenizer, cfg) -> None:
  if tokenizer.vocab_size > cfg.vocab_size:
    raise ValueError(f"--model {directory}: the tokenizer has {tokenizer.vocab_size} "
                     f"tokens (chat markers included) but the model's vocab_size is "
                     f"{cfg.vocab_size}; the chat template's special tokens would be out "
                     "of range. Serve a model trained with this tokenizer.")


def _load_run(directory, config: dict) -> Loaded:
  from c2jax.train import checkpoint as checkpoint_lib  # pylint: disable=g-import-not-at-top
  from c2jax.train import init_params  # pylint: disable=g-import-not-at-top

  if "model" not in config or "data" not in config:
    raise ValueError(f"{directory}/config.json has no model or data section; is it a "
                     "c2jax pretrain / sft / rl run directory?")
  # Rebuilt from the defaults and validated: a run saved by an older c2jax, or a hand-
  # edited config.json, fails here naming the key instead of deep inside the model.
  model_cfg = model_config.defaults()
  configlib.apply_overrides(model_cfg, config["model"])
  model_config.validate(model_cfg)
  data_cfg = data.default_config()
  configlib.apply_overrides(data_cfg, config["data"])
  if data_cfg.tokenizer_file:  # no need to (re)build the run's corpus to read it
    tokenizer = Tokenizer.load(pathlib.Path(data_cfg.tokenizer_file).expanduser())
  else:
    tokenizer = data.prepare_from_config(data_cfg, progress=False).tokenizer()
  _check_vocab(directory, tokenizer, model_cfg)
  fresh = jax.eval_shape(lambda: model.init(model_cfg, jax.random.key(0)))
  restore_cfg = ml_collections.ConfigDict({"init_from": str(directory), "model": model_cfg})
  params = init_params.restore_init_params(restore_cfg, fresh)
  # Serving does not speculate; an untrained (never restored) drafter is dropped.
  params = {k: v for k, v in params.items()
            if not any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(v))}
  checkpointer = checkpoint_lib.Checkpointer(directory / "checkpoints", async_save=False)
  step = checkpointer.steps()[-1]
  checkpointer.close()
  return Loaded(model_cfg, params, tokenizer, directory.name, int(step))


def _load_hf(directory: pathlib.Path) -> Loaded:
  from c2jax import hf  # pylint: disable=g-import-not-at-top

  tokenizer_file = directory / "tokenizer.json"
  if not tokenizer_file.is_file():
    raise FileNotFoundError(f"{directory} has no tokenizer.json; HF directories must "
                            "carry their tokenizer.")
  tokenizer = Tokenizer.load(tokenizer_file)
  cfg, params = hf.load(directory)
  _check_vocab(directory, tokenizer, cfg)
  return Loaded(cfg, params, tokenizer, directory.name, 0)
