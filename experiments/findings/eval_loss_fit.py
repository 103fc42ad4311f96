"""Log-linear fit of held-out eval loss against training tokens, from a run's metrics.

  python -m experiments.findings.eval_loss_fit runs/small/pretrain [--plot docs/figures/x.png]

Fits eval_loss = a + b * ln(tokens) by least squares over the eval rows after step 0
(tokens = step x batch_size x seq_len from the run's config.json), prints the points,
slope b, intercept a and R^2, and optionally saves a plot.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np


def eval_points(workdir: pathlib.Path, key: str = "eval_loss"):
  config = json.loads((workdir / "config.json").read_text())
  tokens_per_step = config["train"]["batch_size"] * config["train"]["seq_len"]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
          if line.strip()]
  points = sorted({r["step"]: r[key] for r in rows if key in r and r["step"] > 0}.items())
  return np.array([s * tokens_per_step for s, _ in points], float), np.array(
      [v for _, v in points], float)


def log_linear_fit(tokens: np.ndarray, loss: np.ndarray) -> dict:
  if len(tokens) < 3:
    raise ValueError(f"need at least 3 eval points after step 0 to fit, got {len(tokens)}; "
                     "lower config.train.eval_every.")
  x = np.log(tokens)
  slope, intercept = np.polyfit(x, loss, 1)
  predicted = intercept + slope * x
  r2 = 1 - np.sum((loss - predicted) ** 2) / np.sum((loss - loss.mean()) ** 2)
  return {"slope": float(slope), "intercept": float(intercept), "r2": float(r2),
          "points": len(tokens)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdir", type=pathlib.Path)
  parser.add_argument("--key", default="eval_loss")
  parser.add_argument("--plot", type=pathlib.Path)
  args = parser.parse_args()
  tokens, loss = eval_points(args.workdir, args.key)
  fit = log_linear_fit(tokens, loss)
  print(f"{'tokens':>12} {args.key:>10}")
  for t, l in zip(tokens, loss):
    print(f"{int(t):>12,} {l:>10.4f}")
  print(f"fit: {args.key} = {fit['intercept']:.4f} + ({fit['slope']:.4f}) * ln(tokens); "
        f"R^2 = {fit['r2']:.4f} over {fit['points']} points")
  if args.plot:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.semilogx(tokens, loss, "o", label="held-out eval")
    grid = np.geomspace(tokens.min(), tokens.max(), 50)
    ax.semilogx(grid, fit["intercept"] + fit["slope"] * np.log(grid), "-",
                label=f"fit: slope {fit['slope']:.3f}, R²={fit['r2']:.3f}")
    ax.set_xlabel("training tokens")
    ax.set_ylabel(args.key)
    ax.set_title(args.workdir.name)
    ax.legend()
    fig.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=120)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
  main()
