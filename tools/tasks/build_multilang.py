"""Builds the committed multi-language suite, configs/suites/multilang.jsonl, from
released packages: Go and Rust source packages from Debian, npm packages, PyPI sdists.

  python -m tools.tasks.build_multilang                     # all of it (~10 min here)
  python -m tools.tasks.build_multilang --only deb:librust-strsim-dev=0.10.0-1
  python -m tools.tasks.build_multilang --print_commands    # the builder commands

Each entry of BUILDS is one `c2jax tasks build --repo SPEC` command (exact versions, a
seed, a task count), run as a subprocess exactly as printed; their suites are joined,
in this order, into the committed JSONL, with each record's environment left empty (a
Python instance's venv layer is a path of the machine that built it: the suite loader
makes the layer again; c2jax/env/packages/instances.py). The build reports and task
repositories stay in --work. A package whose build fails, or gives fewer tasks than its
entry asks for, stops the run with its report's path: the suite is never written short.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

SUITE = os.path.join('configs', 'suites', 'multilang.jsonl')
# (package spec, tasks, seed). Exact versions: a rebuild gives the same records.
BUILDS = (
    ('deb:golang-github-google-shlex-dev=0.0~git20191202.e7afc7f-1', 5, 0),
    ('deb:golang-github-dustin-go-humanize-dev=1.0.0-3', 5, 0),
    ('deb:golang-github-hashicorp-go-version-dev=1.3.0-1', 5, 0),
    ('deb:librust-strsim-dev=0.10.0-1', 5, 0),
    ('deb:librust-semver-dev=1.0.14-1', 5, 0),
    ('deb:librust-itoa-dev=1.0.1-2', 3, 0),
    ('npm:minimist@1.2.8', 5, 0),
    ('npm:left-pad@1.3.0', 2, 0),
    ('npm:deep-equal@2.2.3', 5, 0),
    ('pypi:six==1.16.0', 6, 0),
    ('pypi:toolz==0.12.1', 6, 0),
)


def command(spec: str, tasks: int, seed: int, work: str) -> tuple[list[str], str]:
  """(the build command, the suite it writes)."""
  out = os.path.join(work, spec.replace(':', '_').replace('/', '_') + '.jsonl')
  return [sys.executable, '-m', 'c2jax.cli', 'tasks', 'build', f'--repo={spec}',
          f'--out={out}', f'--max_tasks={tasks}', f'--seed={seed}'], out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--work', default=os.path.join('runs', 'multilang_build'),
                      help='Where the per-package suites, reports and repositories go.')
  parser.add_argument('--out', default=SUITE, help='The joined suite.')
  parser.add_argument('--only', action='append', default=[],
                      help='Build only these specs (and write --out only with all).')
  parser.add_argument('--print_commands', action='store_true')
  parser.add_argument('--reuse', action='store_true',
                      help='Keep a package\'s suite already in --work (a run that stopped '
                      'part way) instead of building it again.')
  args = parser.parse_args(argv)
  builds = [b for b in BUILDS if not args.only or b[0] in args.only]
  if args.print_commands:
    for spec, tasks, seed in builds:
      print(shlex.join(['c2jax'] + command(spec, tasks, seed, args.work)[0][3:]))
    return 0
  os.makedirs(args.work, exist_ok=True)
  records, rows = [], []
  for spec, tasks, seed in builds:
    argv_, out = command(spec, tasks, seed, args.work)
    started = time.monotonic()
    reused = args.reuse and os.path.isfile(out)
    proc = (subprocess.CompletedProcess(argv_, 0) if reused else
            subprocess.run(argv_, capture_output=True, text=True, check=False))
    seconds = time.monotonic() - started
    if proc.returncode != 0:
      print(f'{spec}: build failed (exit {proc.returncode}) after {seconds:.0f} s:\n'
            f'{(proc.stdout + proc.stderr)[-3000:]}', file=sys.stderr)
      return 1
    with open(out) as f:
      built = [json.loads(line) for line in f if line.strip()]
    if len(built) < tasks:
      print(f'{spec}: {len(built)} tasks, the entry asks for {tasks}; see '
            f'{out[:-len(".jsonl")]}.report.json (or raise max_candidates).', file=sys.stderr)
      return 1
    for record in built:
      record['environment'] = ''
    records += built
    row = {'package': spec, 'language': built[0].get('language', 'python'),
           'tasks': len(built), 'build_s': None if reused else round(seconds, 1)}
    rows.append(row)
    print(json.dumps(row), flush=True)
  if args.only and len(builds) < len(BUILDS):
    print(f'--only: {len(records)} records built in {args.work}; {args.out} is left as it '
          'is (it is written from every entry).')
    return 0
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out + '.tmp', 'w') as f:
    for record in records:
      f.write(json.dumps(record, sort_keys=True) + '\n')
  os.replace(args.out + '.tmp', args.out)
  languages = sorted({row['language'] for row in rows})
  print(json.dumps({'suite': args.out, 'instances': len(records), 'languages': languages,
                    'build_s': round(sum(r['build_s'] or 0 for r in rows), 1)}))
  return 0


if __name__ == '__main__':
  sys.exit(main())
