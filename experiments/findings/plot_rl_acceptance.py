"""Speculative-decoding acceptance over RL steps, from `c2jax rl` runs' metrics.jsonl.

  python -m experiments.findings.plot_rl_acceptance online=runs/rl_online \
      frozen=runs/rl_frozen --out docs/figures/rl_mtp_acceptance.png --window 5

Prints a markdown table (mean of each metric over windows of `--window` steps) and plots
draft_tokens_per_step (1 + accepted drafts per verify step), draft_acceptance and the
policy's KL to its starting point per step, one line per run (docs/benchmarks.md, "MTP acceptance during RL").
"""

from __future__ import annotations

import argparse
import json
import pathlib

METRICS = ("draft_tokens_per_step", "draft_acceptance", "mtp0/agree", "mtp0/kl",
           "sampler_nll", "kl")


def read_steps(run_dir) -> list[dict]:
  """The per-step rows (those with a learner loss) of a run's metrics.jsonl."""
  path = pathlib.Path(run_dir) / "metrics.jsonl"
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist; pass a `c2jax rl` run directory.")
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  steps = [row for row in rows if "loss" in row]
  if not any("draft_tokens_per_step" in row for row in steps):
    raise ValueError(f"{path} has no draft_tokens_per_step: was the run started with "
                     "--config.actors.num_draft_tokens > 0?")
  return steps


def table(runs: dict[str, list[dict]], window: int) -> str:
  lines = ["| run | steps | " + " | ".join(METRICS) + " |",
           "|---|---|" + "---|" * len(METRICS)]
  for label, steps in runs.items():
    for start in range(0, len(steps), window):
      chunk = steps[start:start + window]
      cells = []
      for name in METRICS:
        values = [row[name] for row in chunk if name in row]
        cells.append(f"{sum(values) / len(values):.3f}" if values else "-")
      lines.append(f"| {label} | {chunk[0]['step']}-{chunk[-1]['step']} | "
                   + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot(runs: dict[str, list[dict]], out: pathlib.Path) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  # The policy's drift (the sampler's KL to the reference policy) beside the acceptance:
  # runs that drift apart are not comparable step for step.
  panels = (("draft_tokens_per_step", "tokens per verify step (1 + accepted)"),
            ("draft_acceptance", "accepted / drafted"),
            ("kl", "policy KL to the start (nats/token)"))
  fig, axes = plt.subplots(1, len(panels), figsize=(14, 3.6))
  for label, steps in runs.items():
    for ax, (name, _) in zip(axes, panels):
      xs = [row["step"] for row in steps if name in row]
      ax.plot(xs, [row[name] for row in steps if name in row], marker="o", ms=3, label=label)
  for ax, (_, title) in zip(axes, panels):
    ax.set_ylabel(title)
  for ax in axes:
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
  axes[0].legend()
  fig.tight_layout()
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out, dpi=120)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="+", help="LABEL=RUN_DIR")
  parser.add_argument("--out", type=pathlib.Path, default=None, help="PNG to write")
  parser.add_argument("--window", type=int, default=5)
  args = parser.parse_args(argv)
  runs = {}
  for spec in args.runs:
    label, sep, run_dir = spec.partition("=")
    if not sep:
      parser.error(f"{spec!r}: pass runs as LABEL=RUN_DIR")
    runs[label] = read_steps(run_dir)
  print(table(runs, args.window))
  if args.out is not None:
    plot(runs, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
