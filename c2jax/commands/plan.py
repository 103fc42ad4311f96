"""`c2jax plan`: what a config would allocate, computed abstractly (nothing is allocated).

  c2jax plan --config=configs/models.py:kimi_k25 --count
prints one JSON object: total and active parameter counts. `--config` may be a model
config or any job config with a `model` field.
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

from c2jax.model import counting

_CONFIG = config_flags.DEFINE_config_file("config", None, "Model or job config file.")
_COUNT = flags.DEFINE_bool("count", False, "Print total and active parameter counts.")


def main(argv) -> int:
  if len(argv) > 1:
    raise SystemExit(f"c2jax plan: unexpected arguments {argv[1:]}")
  cfg = _CONFIG.value
  if cfg is None:
    raise SystemExit("c2jax plan: pass --config=configs/<file>.py:<arg>")
  model_cfg = cfg.model if "model" in cfg else cfg
  if not _COUNT.value:
    raise SystemExit("c2jax plan: choose what to plan, e.g. --count")
  print(json.dumps(counting.count_params(model_cfg)))
  return 0
