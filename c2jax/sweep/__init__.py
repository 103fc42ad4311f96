"""Sweeps: a grid or list of config overrides, each point its own run, one table.

    c2jax sweep experiments/sweeps/tiny_lr_width.py --workdir=DIR [--parallel N] [--backend=ray]

A sweep file defines `get_sweep(arg=None) -> Sweep` (c2jax/sweep/spec.py); the runner
(c2jax/sweep/runner.py) launches each point as `c2jax <verb>` in DIR/runs/<point>, resumes
after a kill, and writes DIR/results.jsonl, DIR/results.csv and DIR/plots/ (table.py).
"""

from c2jax.sweep.metrics import (Metric, MetricMissing, active_params, at_step, compute_6nd,
                                 config_value, from_json, last, maximum, mean_tail, minimum,
                                 tokens, train_flops)
from c2jax.sweep.runner import dry_run, run
from c2jax.sweep.spec import Plan, Point, Sweep, SweepError, load
from c2jax.sweep.table import read

__all__ = ["Metric", "MetricMissing", "Plan", "Point", "Sweep", "SweepError", "active_params",
           "at_step", "compute_6nd", "config_value", "dry_run", "from_json", "last", "load",
           "maximum", "mean_tail", "minimum", "read", "run", "tokens", "train_flops"]
