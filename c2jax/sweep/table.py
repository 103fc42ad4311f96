"""A sweep's table (DIR/results.jsonl and DIR/results.csv) and a plot of each metric.

One row per point: its name and status, the swept values (one column per dotted key), each
metric, the seconds its last run took, its run directory and log. Points that did not
finish keep their row with empty metrics, so the table always lists the whole sweep.
DIR/plots/<metric>.png has a panel per swept axis: the metric against that axis, one line
per combination of the other axes.
"""

from __future__ import annotations

import csv
import json
import math
import pathlib
from collections.abc import Callable

from c2jax.sweep import metrics as metrics_lib

RESULTS_JSONL = "results.jsonl"
RESULTS_CSV = "results.csv"
PLOTS_DIR = "plots"


def collect(plan, statuses: dict[str, str], run_dir: Callable,
            say: Callable[[str], None]) -> list[dict]:
  rows = []
  for point in plan.points:
    directory = run_dir(point)
    row = {"point": point.name, "status": statuses[point.name]}
    row.update({axis: point.swept.get(axis) for axis in plan.axes})
    for name, metric in plan.sweep.metrics.items():
      row[name] = None
      if row["status"] != "done":
        continue
      try:
        row[name] = metric.collect(directory, point.config)
      except metrics_lib.MetricMissing as err:
        say(f"sweep: point {point.name}: metric {name!r} is empty: {err}")
    done_file = directory / "sweep_done.json"
    row["seconds"] = json.loads(done_file.read_text())["seconds"] if done_file.exists() else None
    row["run_dir"] = str(directory)
    row["log"] = str(directory / "sweep.log")
    rows.append(row)
  return rows


def write(plan, workdir: pathlib.Path, statuses: dict[str, str], *, run_dir: Callable,
          say: Callable[[str], None]) -> dict:
  rows = collect(plan, statuses, run_dir, say)
  jsonl = workdir / RESULTS_JSONL
  jsonl.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
  columns = list(rows[0])
  with open(workdir / RESULTS_CSV, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=columns)
    writer.writeheader()
    for row in rows:
      writer.writerow({k: json.dumps(v) if isinstance(v, (list, tuple, dict)) else v
                       for k, v in row.items()})
  plots = plot(rows, plan.axes, list(plan.sweep.metrics), workdir / PLOTS_DIR)
  say(f"sweep: table {jsonl} and {workdir / RESULTS_CSV}; plots in {workdir / PLOTS_DIR}")
  return {"table": str(jsonl), "csv": str(workdir / RESULTS_CSV),
          "plots": [str(p) for p in plots]}


def read(workdir: str | pathlib.Path) -> list[dict]:
  """The rows of DIR/results.jsonl (what notebooks read)."""
  path = pathlib.Path(workdir) / RESULTS_JSONL
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _numeric(value) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def plot(rows: list[dict], axes, metrics: list[str], out_dir: pathlib.Path) -> list[pathlib.Path]:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  out_dir.mkdir(parents=True, exist_ok=True)
  written = []
  panels = []  # an axis tied one-to-one to an earlier one (width and MLP width) adds nothing
  for axis in axes:
    if not any(_tied(rows, axis, earlier) for earlier in panels):
      panels.append(axis)
  panels = panels or ["point"]
  for metric in metrics:
    usable = [row for row in rows if _numeric(row.get(metric))]
    if not usable:
      continue
    fig, ax_list = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, x_key in zip(ax_list[0], panels):
      others = [a for a in axes if a != x_key and not _tied(rows, a, x_key)]
      _panel(ax, usable, x_key, others, metric)
    fig.suptitle(metric)
    fig.tight_layout()
    path = out_dir / f"{_file_name(metric)}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
  return written


def _tied(rows: list[dict], a: str, b: str) -> bool:
  """Whether the values of axes a and b determine each other across the rows."""
  pairs = {(json.dumps(row.get(a), default=str), json.dumps(row.get(b), default=str))
           for row in rows}
  return len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs})


def _panel(ax, rows: list[dict], x_key: str, others: list[str], metric: str) -> None:
  xs = [row.get(x_key) for row in rows]
  numeric_x = all(_numeric(x) for x in xs)
  categories = list(dict.fromkeys(json.dumps(x, default=str) for x in xs))
  groups: dict[tuple, list[dict]] = {}
  for row in rows:
    groups.setdefault(tuple(json.dumps(row.get(k), default=str) for k in others), []).append(row)

  def position(row):
    return row[x_key] if numeric_x else categories.index(json.dumps(row[x_key], default=str))

  for key, members in groups.items():
    members = sorted(members, key=position)
    label = ", ".join(f"{k.split('.')[-1]}={json.loads(v)}" for k, v in zip(others, key))
    ax.plot([position(r) for r in members], [r[metric] for r in members], "o-",
            label=label or None)
  if numeric_x and min(xs) > 0 and max(xs) / min(xs) > 2.5:
    ax.set_xscale("log")
  if not numeric_x:
    ax.set_xticks(range(len(categories)), [str(json.loads(c)) for c in categories], rotation=30)
  ax.set_xlabel(x_key)
  ax.set_ylabel(metric)
  if others:
    ax.legend(fontsize=7)


def _file_name(metric: str) -> str:
  return "".join(c if c.isalnum() or c in "._-" else "_" for c in metric)
