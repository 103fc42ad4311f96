"""What `c2jax serve --model PATH` loads: model config, parameters, tokenizer, version.

PATH is a c2jax run directory (local or a URL c2jax.storage reads) or a local HF model
directory, loaded by c2jax.train.run_loading (the loader eval and tools share) with the
run's MTP drafter kept for speculative decoding; the policy version is the checkpoint
step (0 for an HF directory) and the served name the directory's. A released checkpoint's
quantised experts stay as stored when --weights_quant names their format.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from c2jax.data.tokenizer import Tokenizer
from c2jax.train import run_loading


@dataclasses.dataclass
class Loaded:
  cfg: ml_collections.ConfigDict  # the model config
  params: dict
  tokenizer: Tokenizer
  name: str  # the id /v1/models reports
  version: int  # policy version of the weights (the checkpoint step)


def load(path: str, weights_quant: str = "none") -> Loaded:
  """`weights_quant`: the engine's; routed experts an HF directory stores in that format
  are loaded as stored (held bit for bit by the engine)."""
  run = run_loading.load_run(path, keep_mtp=True, flag="--model", weights_quant=weights_quant)
  return Loaded(run.cfg, run.params, run.tokenizer, run.directory.name, run.step)
