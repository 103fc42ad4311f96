"""Continued pretraining of a released model: the model config is read from the source.

  c2jax pretrain --config=configs/from_hf.py:/models/DeepSeek-V3-bf16 --workdir=runs/ds3/cpt

The argument is anything `init_from` accepts: an HF model directory (config.json +
safetensors, one file or sharded), `c2jax convert` output, or a c2jax run. config.model is
that source's architecture (so every parameter shape and numerics field matches what is
loaded), config.init_from the source itself; the loop streams its tensors shard by shard
into the run's mesh (c2jax/hf/sources.py, placement.py). Run sizes follow
configs/pretrain.py's CPU `tiny` row; override `--config.train.*` and `--config.parallel.*`
for real hardware.
"""

import pathlib

from c2jax.train import jobs, model_source

_FIXTURE = (pathlib.Path(__file__).resolve().parents[1]
            / "tests/fixtures/hf_saved/deepseek_v3_mtp_declared")
TEST_ARGS = (str(_FIXTURE),)


def get_config(source: str = ""):
  if not source:
    raise ValueError("configs/from_hf.py needs the model to start from: "
                     "--config=configs/from_hf.py:/path/to/hf_model_dir")
  c = jobs.job_defaults("tiny")
  c.model, _ = model_source.source_model(source)
  c.init_from = str(pathlib.Path(source).expanduser().absolute())
  c.data.vocab_size = c.model.vocab_size
  c.train.steps = 200
  c.train.seq_len = min(128, c.model.max_position)
  return c
