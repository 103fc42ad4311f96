"""Scores of an evaluation: accuracy with its standard error, pass@k, best-of-k, costs.

Everything here is a pure function of result records (dicts, one per (task, sample), as
`results.py` stores them). Records with `infra_error` set are counted apart and left out
of every model metric: a sandbox crash or an endpoint outage is not a wrong answer.

Standard error: samples of one task are correlated, so the error of the accuracy is the
spread of the per-task mean scores across tasks, std(task means, ddof=1) / sqrt(T)
(clustered by task). With a single task it falls back to the binomial form
sqrt(p (1 - p) / n) over that task's samples.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Sequence

import numpy as np

# A sample counts as correct for pass@k / best-of-k when its score reaches this.
SOLVED_AT = 1.0


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k of Chen et al. (2021): 1 - C(n-c, k) / C(n, k).

  Computed as the stable product 1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms
  the (huge) binomial coefficients. n samples, c of them correct, 1 <= k <= n.
  """
  if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
    raise TypeError(f"pass_at_k takes integers, got n={n!r}, c={c!r}, k={k!r}.")
  if n < 1 or not 0 <= c <= n:
    raise ValueError(f"pass_at_k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}.")
  if not 1 <= k <= n:
    raise ValueError(f"pass_at_k needs 1 <= k <= n = {n}, got k={k}; draw more samples "
                     "per task (config.eval.samples) or drop k from config.eval.ks.")
  if n - c < k:
    return 1.0  # every k-subset holds a correct sample
  return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def standard_error(task_scores: Sequence[Sequence[float]]) -> float:
  """Clustered standard error of the mean score (see the module docstring)."""
  task_scores = [list(s) for s in task_scores if len(s)]
  if not task_scores:
    return float("nan")
  if len(task_scores) == 1:
    (scores,) = task_scores
    p = float(np.mean(scores))
    return math.sqrt(max(p * (1.0 - p), 0.0) / len(scores))
  means = np.asarray([np.mean(s) for s in task_scores], np.float64)
  return float(means.std(ddof=1) / math.sqrt(len(means)))


def _stat(values: list) -> dict[str, float | None]:
  values = [v for v in values if v is not None]
  if not values:
    return {"mean": None, "median": None}
  return {"mean": float(np.mean(values)), "median": float(np.median(values))}


def _by_task(records) -> dict[str, list[dict]]:
  tasks: dict[str, list[dict]] = collections.defaultdict(list)
  for record in sorted(records, key=lambda r: (r["task_id"], r["sample"])):
    tasks[record["task_id"]].append(record)
  return dict(tasks)


def task_metrics(samples: list[dict], ks: Sequence[int]) -> dict:
  """One task's scores from its (non-infra) sample records."""
  scores = [float(r["score"]) for r in samples]
  correct = sum(s >= SOLVED_AT for s in scores)
  out = {"samples": len(scores), "correct": correct,
         "accuracy": float(np.mean(scores)) if scores else None}
  for k in ks:
    out[f"pass@{k}"] = pass_at_k(len(scores), correct, k) if len(scores) >= k else None
    # Best-of-k as a user running k attempts sees it: the first k samples, any correct.
    first = scores[:k]
    out[f"best_of_{k}"] = float(any(s >= SOLVED_AT for s in first)) if len(first) == k else None
  return out


def _grouped(scored: list[dict], infra: list[dict], field: str) -> dict:
  """Accuracy (over scored episodes), episodes, tasks and infrastructure errors per
  value of a record field."""
  groups: dict[str, list[dict]] = collections.defaultdict(list)
  for r in scored + infra:
    groups[str(r.get(field))].append(r)
  out = {}
  for value, rs in sorted(groups.items()):
    scores = [float(r["score"]) for r in rs if not r.get("infra_error")]
    out[value] = {"episodes": len(scores),
                  "accuracy": float(np.mean(scores)) if scores else None,
                  "tasks": len({r["task_id"] for r in rs}),
                  "infra_errors": sum(bool(r.get("infra_error")) for r in rs)}
  return out


def summarize(records: Iterable[dict], ks: Sequence[int] = (1,)) -> dict:
  """Overall and per-task metrics of a results file's records (last record per
  (task, sample) wins; callers pass the deduplicated list)."""
  records = list(records)
  infra = [r for r in records if r.get("infra_error")]
  scored = [r for r in records if not r.get("infra_error")]
  per_task_records = _by_task(scored)
  per_task = {task: task_metrics(rs, ks) for task, rs in per_task_records.items()}
  scores = [float(r["score"]) for r in scored]
  overall = {
      "tasks": len(per_task),
      "episodes": len(scored),
      "samples_per_task": _stat([m["samples"] for m in per_task.values()]),
      "accuracy": float(np.mean(scores)) if scores else None,
      "accuracy_stderr": standard_error(
          [[float(r["score"]) for r in rs] for rs in per_task_records.values()]),
      "infra_errors": len(infra),
      "infra_error_tasks": sorted({r["task_id"] for r in infra}),
  }
  for k in ks:
    for name in (f"pass@{k}", f"best_of_{k}"):
      values = [m[name] for m in per_task.values() if m[name] is not None]
      overall[name] = float(np.mean(values)) if values else None
      overall[f"{name}_tasks"] = len(values)
  for field in ("completion_tokens", "turns", "tool_calls", "wall_s", "cost"):
    overall[field] = _stat([r.get(field) for r in scored])
  costs = [r.get("cost") for r in scored + infra if r.get("cost") is not None]
  overall["total_cost"] = float(sum(costs)) if costs else None
  overall["by_category"] = _grouped(scored, infra, "category")
  if any(r.get("language") for r in records):  # tasks of several languages
    overall["by_language"] = _grouped(scored, infra, "language")
  reasons = collections.Counter(r.get("finish_reason") for r in scored)
  overall["finish_reasons"] = dict(sorted((str(k), v) for k, v in reasons.items()))
  return {"overall": overall, "per_task": per_task}
