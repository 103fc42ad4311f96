"""Writes LoCoDiff-style state-tracking cases (c2jax.eval.base.state_cases) as JSONL.

  python -m tools.tasks.build_state_tracking --repo . --out cases.jsonl
  python -m tools.tasks.build_state_tracking --procedural 100 --seed 0 --out cases.jsonl
  python -m tools.tasks.build_state_tracking --repo DIR --procedural 20 --out cases.jsonl

--repo reads the histories of a git checkout's tracked files (every kept case is checked
against git: applying its diffs gives the file at its last commit); --procedural adds
generated cases, deterministic in --seed, for when no history is at hand. Prints one JSON
line: how many cases of each kind were written and why files were skipped.
"""

import argparse
import json
import pathlib
import sys

from c2jax.eval.base import state_cases


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--repo", help="a git checkout whose file histories become cases")
  parser.add_argument("--out", required=True, help="output JSONL file")
  parser.add_argument("--max-cases", type=int, default=50, help="cases from --repo at most")
  parser.add_argument("--min-diffs", type=int, default=2)
  parser.add_argument("--max-diffs", type=int, default=8)
  parser.add_argument("--max-chars", type=int, default=24_000,
                      help="bound on a case's first version plus its diffs, in characters")
  parser.add_argument("--extensions", default="",
                      help="comma-separated suffixes to keep (default: every code type)")
  parser.add_argument("--procedural", type=int, default=0, help="generated cases to add")
  parser.add_argument("--seed", type=int, default=0, help="seed of the generated cases")
  args = parser.parse_args(argv)
  if not args.repo and args.procedural <= 0:
    parser.error("give --repo DIR (cases from its git history), --procedural N, or both.")
  cases, summary = [], {"out": args.out}
  if args.repo:
    stats = {}
    extensions = tuple(e.strip() for e in args.extensions.split(",") if e.strip())
    try:
      found = state_cases.git_cases(args.repo, max_cases=args.max_cases,
                                    min_diffs=args.min_diffs, max_diffs=args.max_diffs,
                                    max_chars=args.max_chars, extensions=extensions,
                                    stats=stats)
    except (ValueError, RuntimeError) as e:
      parser.error(str(e))
    cases += found
    summary["git"] = stats
  if args.procedural > 0:
    cases += state_cases.procedural_cases(args.procedural, seed=args.seed)
    summary["procedural"] = args.procedural
  if not cases:
    print(f"no case could be built from {args.repo}: {summary.get('git')}; add "
          "--procedural N or lower --min-diffs.", file=sys.stderr)
    raise SystemExit(1)
  out = pathlib.Path(args.out).expanduser()
  out.parent.mkdir(parents=True, exist_ok=True)
  state_cases.save_jsonl(cases, out)
  summary["cases"] = len(cases)
  print(json.dumps(summary), flush=True)
  return summary


if __name__ == "__main__":
  main()
