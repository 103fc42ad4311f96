"""`c2jax pretrain|sft --config=configs/<phase>.py:<variant> --workdir=DIR`.

Rerunning the same command resumes from the newest readable checkpoint in DIR.
"""

from __future__ import annotations

import json
import sys

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Job config (configs/*.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics).")


def main(argv) -> int:
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments {argv[1:]}")
  if _CONFIG.value is None or _WORKDIR.value is None:
    raise SystemExit("pass --config=configs/<phase>.py:<variant> and --workdir=DIR")
  verb = argv[0].split()[-1]
  if verb in ("pretrain", "sft") and _CONFIG.value.task != verb:
    raise SystemExit(f"c2jax {verb}: the config's task is {_CONFIG.value.task!r}; run "
                     f"`c2jax {_CONFIG.value.task}` for it.")
  from c2jax.train import loop, runtime  # after flag parsing: --help stays fast

  try:
    summary = loop.train(_CONFIG.value, _WORKDIR.value)
  except runtime.NonFiniteLossError as err:
    print(f"error: {err}", file=sys.stderr)
    return 3
  print(json.dumps({k: v for k, v in summary.items() if k != "evals"}))
  return 0
