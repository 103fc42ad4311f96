"""`c2jax rl --config=configs/rl.py:<variant> --workdir=DIR`: learner + rollout actors.

Rerunning the same command resumes from the newest checkpoint in DIR without losing or
repeating a finished group (c2jax/rl/trainer.py).
"""

from __future__ import annotations

import json
import sys

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "RL job config (configs/rl.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (queue, checkpoints, metrics).")


def main(argv) -> int:
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments {argv[1:]}")
  if _CONFIG.value is None or _WORKDIR.value is None:
    raise SystemExit("pass --config=configs/rl.py:<variant> and --workdir=DIR")
  from c2jax.rl import trainer  # after flag parsing: --help stays fast
  from c2jax.rl.actors import backends as actors

  try:
    summary = trainer.train(_CONFIG.value, _WORKDIR.value)
  except actors.ActorFailure as err:
    print(f"error: {err}", file=sys.stderr)
    return 4
  print(json.dumps(summary, default=float))
  return 0
