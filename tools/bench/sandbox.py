"""Sandbox latency and concurrency benchmark.

  python -m tools.bench.sandbox --iterations 30 --max_concurrency 64
  python -m tools.bench.sandbox --backend docker --iterations 30 --max_concurrency 0

Measures, on the chosen backend:
  start:     make_sandbox over a small repository until a first command (`true`) ran;
  read_file / run_shell round trip: one tool call parsed from protocol text and run;
  teardown:  Sandbox.close (processes gone, workspace removed);
  kernel CPU: the CPU time of this host's kernel threads (btrfs-cleaner, kworkers) from
    the first start until they are idle again, per sandbox: the work a sandbox leaves
    the kernel (an engine on another host does its own);
  concurrency: K sandboxes, each running `run_shell` calls back to back for a few
    seconds from its own thread; the largest K (doubling) whose calls all succeed with
    p99 latency under --p99_budget_s is reported as sustained.
Prints a markdown table (median, p99 in milliseconds).
"""

import argparse
import glob
import os
import statistics
import tempfile
import threading
import time

from c2jax.env import make_sandbox
from c2jax.env import tools as tools_lib


def _p(values, q):
  ordered = sorted(values)
  return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _repo() -> str:
  root = tempfile.mkdtemp(prefix='bench-repo-')
  for i in range(20):
    os.makedirs(os.path.join(root, 'pkg'), exist_ok=True)
    with open(os.path.join(root, 'pkg', f'm{i}.py'), 'w') as f:
      f.write(''.join(f'def f{j}(x):\n    return x + {j}\n\n' for j in range(50)))
  return root


def kernel_thread_cpu_s() -> float:
  """CPU seconds of this host's kernel threads (children of kthreadd, pid 2)."""
  ticks = 0
  for path in glob.glob('/proc/[0-9]*/stat'):
    try:
      with open(path) as f:
        fields = f.read().rsplit(')', 1)[1].split()
    except OSError:  # a process that ended meanwhile
      continue
    if fields[1] == '2':
      ticks += int(fields[11]) + int(fields[12])  # utime, stime
  return ticks / os.sysconf('SC_CLK_TCK')


def until_kernel_idle(poll_s: float = 3.0, idle_cpu_s: float = 0.1) -> float:
  """Waits until the kernel threads use under `idle_cpu_s` in `poll_s`; their CPU then."""
  while True:
    before = kernel_thread_cpu_s()
    time.sleep(poll_s)
    after = kernel_thread_cpu_s()
    if after - before < idle_cpu_s:
      return after


def latencies(backend: str, repo: str, iterations: int) -> dict[str, list[float]]:
  out = {'start': [], 'read_file round trip': [], 'run_shell round trip': [],
         'teardown': []}
  read = '<tool_call>{"name": "read_file", "arguments": {"path": "pkg/m3.py"}}</tool_call>'
  shell = '<tool_call>{"name": "run_shell", "arguments": {"command": "true"}}</tool_call>'
  make_sandbox(backend, repo).close()  # one-time probes (overlayfs, cgroups) excluded
  for _ in range(iterations):
    t0 = time.perf_counter()
    box = make_sandbox(backend, repo)
    box.run_shell('true')
    out['start'].append(time.perf_counter() - t0)
    toolbox = tools_lib.Toolbox(box)
    for name, turn in (('read_file round trip', read), ('run_shell round trip', shell)):
      t0 = time.perf_counter()
      _, (obs,) = toolbox.run_turn(turn)
      out[name].append(time.perf_counter() - t0)
      assert obs.ok, obs.output
    t0 = time.perf_counter()
    box.close()
    out['teardown'].append(time.perf_counter() - t0)
  return out


def concurrency(backend: str, repo: str, workers: int, seconds: float):
  """(calls done, failures, p99 seconds) with `workers` sandboxes busy at once."""
  boxes = [make_sandbox(backend, repo) for _ in range(workers)]
  times, failures, lock = [], [0], threading.Lock()
  stop = time.monotonic() + seconds

  def work(box):
    while time.monotonic() < stop:
      t0 = time.perf_counter()
      result = box.run_shell('echo ok')
      with lock:
        times.append(time.perf_counter() - t0)
        failures[0] += result.text != 'ok\n'
  threads = [threading.Thread(target=work, args=(b,)) for b in boxes]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  for box in boxes:
    box.close()
  return len(times), failures[0], _p(times, 0.99)


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--backend', default='bubblewrap')
  parser.add_argument('--iterations', type=int, default=30)
  parser.add_argument('--max_concurrency', type=int, default=64,
                      help='0: latencies only')
  parser.add_argument('--seconds', type=float, default=3.0, help='per concurrency level')
  parser.add_argument('--p99_budget_s', type=float, default=1.0)
  args = parser.parse_args()
  repo = _repo()
  kernel_before = until_kernel_idle()
  print('| measurement | median (ms) | p99 (ms) |\n|---|---|---|')
  for name, values in latencies(args.backend, repo, args.iterations).items():
    print(f'| {name} | {1e3 * statistics.median(values):.1f} | '
          f'{1e3 * _p(values, 0.99):.1f} |')
  kernel_s = until_kernel_idle() - kernel_before
  print(f'\nkernel threads: {kernel_s:.1f} CPU-s until idle, '
        f'{1e3 * kernel_s / (args.iterations + 1):.0f} ms per sandbox')
  if args.max_concurrency < 1:
    return
  print('\n| concurrent sandboxes | calls/s | failures | p99 call (ms) |\n|---|---|---|---|')
  sustained, workers = 0, 1
  while workers <= args.max_concurrency:
    calls, failures, p99 = concurrency(args.backend, repo, workers, args.seconds)
    print(f'| {workers} | {calls / args.seconds:.0f} | {failures} | {1e3 * p99:.0f} |')
    if failures or p99 > args.p99_budget_s:
      break
    sustained, workers = workers, workers * 2
  print(f'\nsustained: {sustained} concurrent sandboxes (p99 call < '
        f'{args.p99_budget_s:g} s, no failures)')


if __name__ == '__main__':
  main()
