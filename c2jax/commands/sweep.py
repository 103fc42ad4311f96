"""`c2jax sweep experiments/sweeps/<file>.py[:arg] --workdir=DIR [--parallel N]
[--backend=local|ray]`.

Runs every point of a sweep file as its own `c2jax <verb>` process in DIR/runs/<point>,
N at a time (local processes or Ray tasks), and writes DIR/results.jsonl, DIR/results.csv
and DIR/plots/<metric>.png. Rerunning the same command skips finished points and resumes
the rest from their checkpoints. Exits 1 if any point failed (each is listed with its log).
"""

from __future__ import annotations

import json
import sys

from absl import flags

_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep directory (runs/, results, plots).")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Points run at the same time.")
_BACKEND = flags.DEFINE_enum("backend", "local", ["local", "ray"],
                             "local: child processes; ray: Ray tasks (RAY_ADDRESS or a "
                             "local Ray).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "List the points and their status; run nothing.")
_SET = flags.DEFINE_multi_string("set", [], "KEY=VALUE set on every point's config, e.g. "
                                 "--set=data.cache_dir=/shared/data (repeatable).")


def main(argv) -> int:
  if len(argv) != 2:
    raise SystemExit("usage: c2jax sweep experiments/sweeps/<file>.py[:arg] --workdir=DIR "
                     "[--parallel=N] [--backend=local|ray] [--dry_run] [--set=KEY=VALUE]")
  if _WORKDIR.value is None:
    raise SystemExit("c2jax sweep: pass --workdir=DIR (where the runs and the table go).")
  from c2jax import sweep  # after flag parsing: --help stays fast

  try:
    plan = sweep.load(argv[1], _SET.value)
    if _DRY_RUN.value:
      sweep.dry_run(plan, _WORKDIR.value, say=print)
      return 0
    summary = sweep.run(plan, _WORKDIR.value, parallel=_PARALLEL.value, backend=_BACKEND.value)
  except sweep.SweepError as err:
    print(f"c2jax sweep: {err}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("c2jax sweep: interrupted; rerun the same command to resume.", file=sys.stderr)
    return 130
  print(json.dumps({k: summary[k] for k in ("points", "done", "failed", "table", "preempted")}))
  if summary["preempted"]:
    return 0  # stopped on a signal: the rerun resumes
  return 1 if summary["failed"] or summary["done"] < summary["points"] else 0
