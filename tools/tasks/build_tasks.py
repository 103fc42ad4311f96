"""Builds task suites for c2jax environments.

  # Procedural tasks, solved by the scripted solver through the tools; writes
  # tasks.jsonl and the solver's traces (OpenAI-style message lists) for SFT:
  python -m tools.tasks.build_tasks procgen --out runs/suite --count 40 --seed 0

  # Revert-and-restore tasks from a real package's sdist and tests:
  python -m tools.tasks.build_tasks revert_restore --out runs/rr --package six==1.16.0

Every procedural task is checked: its hidden tests fail before and pass after the
solver's edits; a task the solver cannot solve is an error (the generator is broken).
"""

import argparse
import json
import os
import sys

from c2jax.agent import solver
from c2jax.env import procgen, revert_restore, sandbox as sandbox_lib
from c2jax.env import tasks as tasks_lib


def build_procgen(out_dir: str, count: int, seed: int, backend: str = 'bubblewrap'):
  """Generates `count` tasks and solves each through the tools; returns (tasks, traces)."""
  suite = procgen.generate_suite(os.path.join(out_dir, 'repos'), count, seed)
  return suite, solver.solve_suite(suite, backend)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('kind', choices=['procgen', 'revert_restore'])
  parser.add_argument('--out', required=True, help='Output folder.')
  parser.add_argument('--count', type=int, default=20, help='procgen: number of tasks.')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--package', default='six==1.16.0',
                      help='revert_restore: pip requirement of a pure-Python package.')
  parser.add_argument('--max_tasks', type=int, default=3)
  parser.add_argument('--backend', default='bubblewrap')
  args = parser.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  if args.kind == 'procgen':
    suite, traces = build_procgen(args.out, args.count, args.seed, args.backend)
    with open(os.path.join(args.out, 'traces.jsonl'), 'w') as f:
      for trace in traces:
        f.write(json.dumps(trace) + '\n')
  else:
    suite = revert_restore.build(
        args.package, args.out, lambda repo: sandbox_lib.make_sandbox(args.backend, repo),
        max_tasks=args.max_tasks, seed=args.seed)
  tasks_lib.save_jsonl(suite, os.path.join(args.out, 'tasks.jsonl'))
  print(f'wrote {len(suite)} {args.kind} tasks to {args.out}/tasks.jsonl')
  return 0


if __name__ == '__main__':
  sys.exit(main())
