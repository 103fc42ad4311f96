"""Auto-install benchmark: success rate and time over real PyPI sdists that ship tests.

  python -m tools.bench.install --out runs/bench_install.json six==1.16.0 ...

Each sdist is downloaded with pip (cached), installed by `c2jax.env.install` with the
default config (heuristic proposer, PyPI-only egress; --timeout_s per command) into a fresh cache, and its row
(name, version, ok, attempts, tests collected/passed, seconds) printed as Markdown.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

from c2jax.env import revert_restore
from c2jax.env.install import InstallConfig, install


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('requirements', nargs='+', help='pinned sdists, e.g. six==1.16.0')
  parser.add_argument('--cache_dir',
                      default=os.path.join(tempfile.gettempdir(), 'c2jax-bench-envs'))
  parser.add_argument('--out', default='')
  parser.add_argument('--timeout_s', type=float, default=300.0,
                      help='limit of each install command and of the test run')
  args = parser.parse_args()
  rows = []
  for requirement in args.requirements:
    try:
      sdist = revert_restore.download_sdist(requirement)
      result = install(sdist, InstallConfig(cache_dir=args.cache_dir,
                                                   timeout_s=args.timeout_s))
      tests = result.verification or (result.attempts[-1]['test_summary']
                                      if result.attempts else {})
      row = dict(package=requirement, ok=result.ok, attempts=len(result.attempts),
                 collected=tests.get('collected', 0), passed=tests.get('passed', 0),
                 seconds=round(result.duration_s, 1),
                 error='' if result.ok else result.error.strip().splitlines()[-1][:120])
    except Exception as e:  # pylint: disable=broad-except
      row = dict(package=requirement, ok=False, attempts=0, collected=0, passed=0,
                 seconds=0.0, error=f'{type(e).__name__}: {e}'[:120])
    rows.append(row)
    print(json.dumps(row), flush=True)
  print('\n| package | ok | attempts | tests passed/collected | seconds |')
  print('|---|---|---|---|---|')
  for r in rows:
    print(f"| {r['package']} | {'yes' if r['ok'] else 'no: ' + r['error']} | {r['attempts']} "
          f"| {r['passed']}/{r['collected']} | {r['seconds']} |")
  times = [r['seconds'] for r in rows if r['ok']]
  print(f"\nsuccess {sum(r['ok'] for r in rows)}/{len(rows)}; median time of successes "
        f"{statistics.median(times) if times else float('nan'):.1f}s")
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(rows, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
