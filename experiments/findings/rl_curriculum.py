"""RL with the running curriculum on vs off: the same `c2jax rl` runs, same seeds.

Runs `c2jax rl` once per (curriculum, seed) with identical config apart from
`rl.curriculum.sampling` ('order' = off: every prompt once, in the pool's order;
'running' = draws weighted by running statistics) and `learner.seed` (which seeds the
rollouts and the draws; tasks and held-out set are the same for every run), then plots
held-out pass rate per evaluation, training pass rate and the fraction of zero-advantage
groups per step, and prints a markdown table.

  python -m experiments.findings.rl_curriculum --root runs/rl_curriculum \
      --seeds 0,1 --figure docs/figures/rl_curriculum.png -- \
      --config=configs/rl.py:tiny --config.init_from=runs/tiny/sft ...
Everything after `--` goes to every `c2jax rl` command. `--plot_only` re-reads finished
runs under --root.
"""

import argparse
import json
import pathlib
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
MODES = ("order", "running")


def workdir(root, mode, seed):
  return pathlib.Path(root) / f"{mode}-seed{seed}"


def run_rl(root, mode, seed, extra):
  """One `c2jax rl` run in a subprocess (resumes if the workdir holds a checkpoint)."""
  path = workdir(root, mode, seed)
  command = [sys.executable, "-m", "c2jax.cli", "rl", f"--workdir={path}", *extra,
             f"--config.rl.curriculum.sampling={mode}", f"--config.learner.seed={seed}"]
  path.mkdir(parents=True, exist_ok=True)
  print(f"[{mode} seed {seed}] {' '.join(command[1:])}", flush=True)
  with open(path.parent / f"{path.name}.log", "ab") as log:
    subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                   check=True)


def read_rows(root, mode, seed):
  metrics = workdir(root, mode, seed) / "metrics.jsonl"
  return [json.loads(line) for line in metrics.read_text().splitlines()]


def curves(rows):
  """{name: (steps, values)}: held-out pass rate, training pass rate, zero-advantage
  groups and (running curriculum only) the effective number of prompts drawn from."""
  out = {}
  for key, name in (("eval/pass_rate", "heldout"), ("pass_rate", "train"),
                    ("uniform_groups", "uniform"),
                    ("curriculum/effective_prompts", "effective")):
    points = sorted({row["step"]: row[key] for row in rows if key in row}.items())
    out[name] = (np.array([p[0] for p in points]), np.array([p[1] for p in points]))
  return out


def _smooth(values, window):
  if len(values) < window:
    return values
  return np.convolve(values, np.ones(window) / window, mode="valid")


def plot(results, figure, window):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  colors = {"order": "tab:blue", "running": "tab:orange"}
  titles = {"heldout": "held-out pass rate",
            "train": "training pass rate" + (f" ({window}-step mean)" if window > 1 else ""),
            "effective": "running curriculum: effective prompts (exp entropy)"}
  names = ("heldout", "train", "effective")
  first_seed = min(s for _, s in results)
  for (mode, seed), c in sorted(results.items()):
    label = f"{'off' if mode == 'order' else 'running'} seed {seed}"
    # Off: thick solid; running: thin dashed on top, so equal curves both show.
    style = dict(color=colors[mode], label=label, alpha=1.0 if seed == first_seed else 0.6,
                 linestyle="-" if mode == "order" else "--",
                 linewidth=4 if mode == "order" else 1.5)
    for ax, name in zip(axes, names):
      steps, values = c[name]
      if not len(steps):
        continue
      if name == "train":
        values = _smooth(values, window)
        steps = steps[len(steps) - len(values):]
      ax.plot(steps, values, marker="o" if name == "heldout" else None, **style)
  for ax, name in zip(axes, names):
    ax.set_title(titles[name])
    ax.set_xlabel("learner step")
    ax.grid(alpha=0.3)
    if name != "effective":
      ax.set_ylim(-0.02, 1.0)
  axes[0].legend()
  fig.tight_layout()
  fig.savefig(figure, dpi=110)
  print(f"wrote {figure}")


def _ends(values):
  return f"{values[0]:.1f} -> {values[-1]:.1f}" if len(values) else "-"


def table(results):
  lines = ["| curriculum | seed | held-out pass rate by step | mean train pass rate | "
           "zero-advantage groups | effective prompts, first -> last step |",
           "|---|---|---|---|---|---|"]
  for (mode, seed), c in sorted(results.items()):
    steps, values = c["heldout"]
    evals = " / ".join(f"{s}: {v:.1%}" for s, v in zip(steps, values))
    lines.append(f"| {'off (order)' if mode == 'order' else 'running'} | {seed} | {evals} | "
                 f"{np.mean(c['train'][1]):.1%} | {np.mean(c['uniform'][1]):.0%} | "
                 f"{_ends(c['effective'][1])} |")
  return "\n".join(lines)


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--root", required=True)
  parser.add_argument("--seeds", default="0,1")
  parser.add_argument("--modes", default=",".join(MODES))
  parser.add_argument("--figure", default="")
  parser.add_argument("--window", type=int, default=1)
  parser.add_argument("--plot_only", action="store_true")
  args, extra = parser.parse_known_args(argv)
  extra = [a for a in extra if a != "--"]
  seeds = [int(s) for s in args.seeds.split(",")]
  modes = args.modes.split(",")
  if not set(modes) <= set(MODES):
    parser.error(f"--modes must be among {MODES}, not {modes}")
  if not args.plot_only:
    for seed in seeds:
      for mode in modes:
        run_rl(args.root, mode, seed, extra)
  results = {(m, s): curves(read_rows(args.root, m, s)) for m in modes for s in seeds}
  print(table(results))
  if args.figure:
    plot(results, args.figure, args.window)


if __name__ == "__main__":
  main(sys.argv[1:])
