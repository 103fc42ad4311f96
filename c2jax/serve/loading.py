"""What `c2jax serve --model PATH` loads: model config, parameters, tokenizer, version.

One function, `load`, so that new checkpoint kinds (a converted c2jax CKPT, an HF chat
template) extend it in one place. PATH is either
  - a c2jax run directory (`config.json` + `checkpoints/`, as pretrain / sft / rl write):
    the newest checkpoint's parameters through train.loop.restore_init_params (the same
    shape checks every phase uses), the run's tokenizer from its data config, and the
    checkpoint step as the policy version; or
  - an HF directory (`config.json` with `model_type` + safetensors + `tokenizer.json`)
    through c2jax.hf.load, policy version 0.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import ml_collections

from c2jax import data, model
from c2jax.data.tokenizer import Tokenizer


@dataclasses.dataclass
class Loaded:
  cfg: ml_collections.ConfigDict  # the model config
  params: dict
  tokenizer: Tokenizer
  name: str  # the id /v1/models reports
  version: int  # policy version of the weights (the checkpoint step)


def load(path: str) -> Loaded:
  directory = pathlib.Path(path).expanduser().absolute()
  config_file = directory / "config.json"
  if not config_file.is_file():
    raise FileNotFoundError(f"--model {path}: no config.json there; pass a c2jax run "
                            "directory (with checkpoints/) or an HF model directory.")
  config = json.loads(config_file.read_text())
  if (directory / "checkpoints").is_dir():
    loaded = _load_run(directory, config)
  elif "model_type" in config:
    loaded = _load_hf(directory)
  else:
    raise ValueError(f"--model {path}: config.json is neither a c2jax run's (no "
                     "checkpoints/ beside it) nor an HF model's (no model_type).")
  if loaded.tokenizer.vocab_size > loaded.cfg.vocab_size:
    raise ValueError(f"--model {path}: the tokenizer has {loaded.tokenizer.vocab_size} "
                     f"tokens (chat markers included) but the model's vocabulary is "
                     f"{loaded.cfg.vocab_size}; the chat template's special tokens would "
                     "be out of range. Serve a model trained with this tokenizer.")
  return loaded


def _load_run(directory: pathlib.Path, config: dict) -> Loaded:
  from c2jax.train import checkpoint as checkpoint_lib  # pylint: disable=g-import-not-at-top
  from c2jax.train import loop  # pylint: disable=g-import-not-at-top

  cfg = ml_collections.ConfigDict(config)
  if "model" not in cfg or "data" not in cfg:
    raise ValueError(f"{directory}/config.json has no model or data section; is it a "
                     "c2jax pretrain / sft / rl run directory?")
  model_cfg = cfg.model
  fresh = jax.eval_shape(lambda: model.init(model_cfg, jax.random.key(0)))
  restore_cfg = ml_collections.ConfigDict({"init_from": str(directory), "model": model_cfg})
  params = loop.restore_init_params(restore_cfg, fresh)
  # Serving does not speculate; an untrained (never restored) drafter is dropped.
  params = {k: v for k, v in params.items()
            if not any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(v))}
  checkpointer = checkpoint_lib.Checkpointer(directory / "checkpoints", async_save=False)
  step = checkpointer.steps()[-1]
  checkpointer.close()
  tokenizer = data.prepare_from_config(cfg.data, progress=False).tokenizer()
  return Loaded(model_cfg, params, tokenizer, directory.name, int(step))


def _load_hf(directory: pathlib.Path) -> Loaded:
  from c2jax import hf  # pylint: disable=g-import-not-at-top

  tokenizer_file = directory / "tokenizer.json"
  if not tokenizer_file.is_file():
    raise FileNotFoundError(f"{directory} has no tokenizer.json; HF directories must "
                            "carry their tokenizer.")
  cfg, params = hf.load(directory)
  return Loaded(cfg, params, Tokenizer.load(tokenizer_file), directory.name, 0)
