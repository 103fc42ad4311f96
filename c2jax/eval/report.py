"""`c2jax eval report DIR [DIR...]`: one table across eval runs and a Pareto plot.

Each run is re-summarised from its results.jsonl (so a run still in progress or killed
reports what it has). Runs of scored suites (base-model evals) get a table per suite with
the suite's own metrics (perplexity, bits/byte; mean character similarity, exact match).
Writes OUT.md (markdown tables), OUT.json (the same rows, full precision) and OUT.png:
accuracy against median completion tokens, one labelled point per run with standard-error
bars, the Pareto front (no other run is both more accurate and cheaper in tokens) joined
by a line.
"""

from __future__ import annotations

import json
import math
import pathlib
import re

from c2jax.eval import metrics, results, suites

_COLUMNS = (("run", "run"), ("suite", "suite"), ("policy", "policy"), ("tasks", "tasks"),
            ("episodes", "episodes"), ("accuracy", "accuracy"), ("± se", "accuracy_stderr"),
            ("median tokens", "median_completion_tokens"), ("mean turns", "mean_turns"),
            ("mean tool calls", "mean_tool_calls"), ("mean wall s", "mean_wall_s"),
            ("cost", "total_cost"), ("infra errors", "infra_errors"))


def run_row(workdir) -> dict:
  workdir = pathlib.Path(workdir)
  records = results.load_records(workdir)
  pinned_path = workdir / results.CONFIG
  ks = (1,)
  summary_path = workdir / results.SUMMARY
  if summary_path.exists():
    saved = json.loads(summary_path.read_text())["overall"]
    ks = tuple(sorted(int(k.split("@")[1]) for k in saved if k.startswith("pass@")
                      and not k.endswith("_tasks"))) or (1,)
  overall = metrics.summarize(records, ks)["overall"]
  first = records[0] if records else {}
  row = {"run": workdir.name, "dir": str(workdir), "suite": first.get("suite"),
         "policy": first.get("policy"), "tasks": overall["tasks"],
         "episodes": overall["episodes"], "accuracy": overall["accuracy"],
         "accuracy_stderr": overall["accuracy_stderr"],
         "median_completion_tokens": overall["completion_tokens"]["median"],
         "mean_turns": overall["turns"]["mean"], "mean_tool_calls": overall["tool_calls"]["mean"],
         "mean_wall_s": overall["wall_s"]["mean"], "total_cost": overall["total_cost"],
         "infra_errors": overall["infra_errors"]}
  for k in ks:
    row[f"pass@{k}"], row[f"best_of_{k}"] = overall[f"pass@{k}"], overall[f"best_of_{k}"]
  row["pinned"] = json.loads(pinned_path.read_text()) if pinned_path.exists() else None
  suite = suites.get_suite(row["suite"]) if row["suite"] in suites.suite_names() else None
  if suite is not None and suite.metrics is not None:
    row["metrics"] = suite.metrics(records)
  return row


def _cell(value) -> str:
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return "–"
  if isinstance(value, float):
    return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
  return str(value)


def _table(columns, rows) -> list[str]:
  lines = ["| " + " | ".join(title for title, _ in columns) + " |",
           "|" + "|".join("---" for _ in columns) + "|"]
  for row in rows:
    lines.append("| " + " | ".join(_cell(row.get(key)) for _, key in columns) + " |")
  return lines


def markdown(rows: list[dict]) -> str:
  """One table of the agent-suite runs, then one per scored suite with its metrics."""
  agent_rows = [r for r in rows if "metrics" not in r]
  lines = _agent_table(agent_rows) if agent_rows else []
  for name in sorted({r["suite"] for r in rows if "metrics" in r}):
    group = [r for r in rows if "metrics" in r and r["suite"] == name]
    columns = [("run", "run"), ("policy", "policy")] + [
        (c, c) for c in suites.get_suite(name).columns]
    if lines:
      lines.append("")
    lines += [f"**{name}**", ""]
    lines += _table(columns, [dict(r["metrics"], run=r["run"], policy=r["policy"])
                              for r in group])
  return "\n".join(lines) + "\n"


def _agent_table(rows: list[dict]) -> list[str]:
  extra = sorted({k for r in rows for k in r if k.startswith(("pass@", "best_of_"))},
                 key=lambda k: (k.startswith("best_of_"), int(re.sub(r"\D", "", k))))
  columns = list(_COLUMNS[:7]) + [(k, k) for k in extra] + list(_COLUMNS[7:])
  return _table(columns, rows)


def pareto_front(rows: list[dict]) -> list[dict]:
  """Runs that no other run beats on both accuracy (higher) and median tokens (lower)."""
  points = [r for r in rows if r["accuracy"] is not None
            and r["median_completion_tokens"] is not None]
  front = [r for r in points if not any(
      o is not r and o["accuracy"] >= r["accuracy"]
      and o["median_completion_tokens"] <= r["median_completion_tokens"]
      and (o["accuracy"] > r["accuracy"]
           or o["median_completion_tokens"] < r["median_completion_tokens"]) for o in points)]
  return sorted(front, key=lambda r: r["median_completion_tokens"])


def plot(rows: list[dict], path) -> bool:
  """The Pareto PNG; False (and no file) when no run has token counts to plot."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  points = [r for r in rows if r["accuracy"] is not None
            and r["median_completion_tokens"] is not None]
  if not points:
    return False
  fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
  for row in points:
    err = row["accuracy_stderr"]
    ax.errorbar(row["median_completion_tokens"], row["accuracy"],
                yerr=None if err is None or math.isnan(err) else err, fmt="o", capsize=3)
    ax.annotate(row["run"], (row["median_completion_tokens"], row["accuracy"]),
                textcoords="offset points", xytext=(5, 5), fontsize=8)
  front = pareto_front(points)
  if len(front) > 1:
    ax.plot([r["median_completion_tokens"] for r in front], [r["accuracy"] for r in front],
            "--", color="gray", linewidth=1, label="Pareto front")
    ax.legend(loc="lower right", fontsize=8)
  ax.set_ylim(-0.03, 1.03)  # accuracy is a share: keep the whole range in view
  ax.set_xlabel("median completion tokens per episode")
  ax.set_ylabel("accuracy (± standard error)")
  suites = sorted({str(r["suite"]) for r in points})
  ax.set_title("accuracy vs completion tokens: " + ", ".join(suites))
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return True


def write_report(dirs, out: str | None = None) -> dict:
  rows = [run_row(d) for d in dirs]
  out = pathlib.Path(out) if out else pathlib.Path(dirs[0]) / "report"
  out.parent.mkdir(parents=True, exist_ok=True)
  paths = {"markdown": out.with_suffix(".md"), "json": out.with_suffix(".json")}
  paths["markdown"].write_text(markdown(rows))
  paths["json"].write_text(json.dumps({"runs": rows,
                                       "pareto_front": [r["run"] for r in pareto_front(rows)]},
                                      indent=2, default=float))
  if plot(rows, out.with_suffix(".png")):
    paths["png"] = out.with_suffix(".png")
  return paths
