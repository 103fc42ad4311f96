"""A trained model from a c2jax run directory, for the base-model evals.

A run directory (written by `c2jax pretrain` / `sft` / `pipeline`) holds `config.json`, the
resolved job config, and `checkpoints/`. The model config and the tokenizer travel with the
run (DESIGN.md §2): the model is rebuilt from config.json's `model` section, the tokenizer
from its `data` section (the same cached corpus + tokenizer the run trained with; built
again if this machine has no cache), and the newest parameters are restored by
`c2jax.train.init_params.restore_init_params`, the one restore path every later phase uses, with
its checks that every parameter exists with the configured shape.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import ml_collections

from c2jax import config as configlib
from c2jax import data, model, storage
from c2jax.model import config as model_config
from c2jax.train import init_params


@dataclasses.dataclass(frozen=True)
class LoadedRun:
  cfg: ml_collections.ConfigDict  # the model config
  params: dict
  tokenizer: data.Tokenizer
  directory: object  # pathlib.Path, or etils.epath.Path for a URL (c2jax.storage)


def _job_config(directory) -> dict:
  path = directory / "config.json"
  if not path.is_file():
    raise FileNotFoundError(
        f"{path} not found: pass a c2jax run directory (the --workdir of `c2jax pretrain` "
        "/ `sft`, holding config.json and checkpoints/).")
  job = json.loads(path.read_text())
  missing = [k for k in ("model", "data") if not isinstance(job.get(k), dict)]
  if missing:
    raise ValueError(f"{path} has no {missing} section(s); it is not the config of a "
                     "training run (RL runs keep theirs under their policy phase).")
  return job


def load_run(run_dir: str | os.PathLike, *, keep_mtp: bool = False,
             progress: bool = False) -> LoadedRun:
  """The run's model config, newest parameters and tokenizer. `run_dir` is a local path
  or any URL c2jax.storage reads (gs://, s3://, file://).

  keep_mtp: keep the multi-token-prediction modules (for speculative decoding); by
  default they are left out, as scoring and greedy decoding do not use them.
  """
  directory = storage.orbax_path(run_dir, "run directory")
  job = _job_config(directory)
  cfg = model_config.defaults()
  configlib.apply_overrides(cfg, job["model"])
  if not keep_mtp:
    cfg.num_mtp_layers = 0
  model_config.validate(cfg)
  data_cfg = data.default_config()
  configlib.apply_overrides(data_cfg, job["data"], "data.")
  tokenizer = data.prepare_from_config(data_cfg, progress=progress).tokenizer()
  if tokenizer.vocab_size > cfg.vocab_size:
    raise ValueError(f"{directory}: the tokenizer has {tokenizer.vocab_size} tokens but the "
                     f"model's vocab_size is {cfg.vocab_size}; config.json's data section "
                     "does not name the tokenizer this run trained with.")
  abstract = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  restore_cfg = ml_collections.ConfigDict({"init_from": str(directory), "model": cfg})
  params = init_params.restore_init_params(restore_cfg, abstract)
  return LoadedRun(cfg, params, tokenizer, directory)
