"""`c2jax pipeline`: every stage end to end, each resumable (rerun reports finished stages).

  c2jax pipeline --config=configs/pipeline.py:tiny --workdir=runs/tiny
  c2jax pipeline --config=configs/agent_sft.py:tiny_rl --workdir=runs/tiny_agent   # ... -> RL

The stages (pretrain, longctx, traces, sft, rl, eval) and how they chain: c2jax/pipeline.py.
Every stage's result lands in WORKDIR/summary.json.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pipeline config (configs/pipeline.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Root directory; stages go in WORKDIR/<stage>.")


def main(argv) -> int:
  if len(argv) > 1:
    raise SystemExit(f"c2jax pipeline: unexpected arguments {argv[1:]}")
  if _CONFIG.value is None or _WORKDIR.value is None:
    raise SystemExit("pass --config=configs/pipeline.py:<variant> and --workdir=DIR")
  from c2jax import pipeline  # after flag parsing: --help stays fast
  from c2jax.config import ConfigError
  from c2jax.rl.actors import backends as actors

  try:
    pipeline.run(_CONFIG.value, _WORKDIR.value)
  except ConfigError as err:
    raise SystemExit(f"c2jax pipeline: {err}") from None
  except actors.ActorFailure as err:
    raise SystemExit(f"c2jax pipeline: rl stage: {err}") from None
  return 0
