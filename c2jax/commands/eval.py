"""`c2jax eval --config=configs/eval.py:<suite> --workdir=DIR` and
`c2jax eval report DIR [DIR...] --out=OUT`.

The first scores a policy (checkpoint, endpoint or oracle) on a suite, streaming
DIR/results.jsonl and resuming when rerun; the second tabulates run dirs (markdown +
JSON) and plots accuracy against median completion tokens (PNG).
"""

from __future__ import annotations

import json
import sys

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None,
                                          "Eval config (configs/eval.py:<suite>).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory of `c2jax eval`.")
_OUT = flags.DEFINE_string("out", None, "`eval report`: output prefix (OUT.md, OUT.json, "
                           "OUT.png); default DIR/report for the first DIR.")


def main(argv) -> int:
  from c2jax import config as configlib  # pylint: disable=g-import-not-at-top

  if len(argv) > 1 and argv[1] == "report":
    from c2jax.eval import report  # pylint: disable=g-import-not-at-top

    dirs = argv[2:]
    if not dirs:
      raise SystemExit("usage: c2jax eval report DIR [DIR...] [--out=OUT]")
    paths = report.write_report(dirs, _OUT.value)
    print(json.dumps({k: str(v) for k, v in paths.items()}))
    return 0
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments {argv[1:]}; `c2jax eval --config=... "
                     "--workdir=DIR` or `c2jax eval report DIR [DIR...]`.")
  if _CONFIG.value is None or _WORKDIR.value is None:
    raise SystemExit("pass --config=configs/eval.py:<suite> and --workdir=DIR")
  from c2jax.eval import runner  # pylint: disable=g-import-not-at-top

  try:
    summary = runner.run(_CONFIG.value, _WORKDIR.value)
  except configlib.ConfigError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  overall = summary.get("metrics") or summary["overall"]  # a scored suite's own metrics
  print(json.dumps({k: v for k, v in overall.items() if not isinstance(v, dict)},
                   default=float))
  if "by_language" in overall:
    print(json.dumps({"by_language": overall["by_language"]}, default=float))
  return 0
