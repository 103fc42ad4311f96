"""pass@k, standard errors and summaries against hand-computed values."""

import math

import pytest

from c2jax.eval import metrics


@pytest.mark.parametrize("k, expected", [(1, 2 / 5), (2, 1 - 3 / 10), (3, 1 - 1 / 10),
                                         (4, 1.0), (5, 1.0)])
def test_pass_at_k_n5_c2_matches_binomials(k, expected):
  # 1 - C(3, k) / C(5, k): C(3,1)/C(5,1) = 3/5, C(3,2)/C(5,2) = 3/10, C(3,3)/C(5,3) = 1/10.
  assert metrics.pass_at_k(5, 2, k) == pytest.approx(expected, abs=1e-12)
  assert metrics.pass_at_k(5, 2, k) == pytest.approx(
      1 - math.comb(3, k) / math.comb(5, k), abs=1e-12)


def test_pass_at_k_edges_and_large_n():
  assert metrics.pass_at_k(7, 0, 3) == 0.0
  assert metrics.pass_at_k(7, 7, 1) == 1.0
  assert metrics.pass_at_k(1, 1, 1) == 1.0
  # Large n: the product form stays exact where the binomials would be astronomically big.
  assert metrics.pass_at_k(2000, 1, 1) == pytest.approx(1 / 2000, rel=1e-9)
  assert metrics.pass_at_k(2000, 3, 100) == pytest.approx(
      1 - math.comb(1997, 100) / math.comb(2000, 100), rel=1e-9)
  with pytest.raises(ValueError, match="config.eval.samples"):
    metrics.pass_at_k(3, 1, 4)
  with pytest.raises(ValueError, match="0 <= c <= n"):
    metrics.pass_at_k(3, 4, 1)


def test_standard_error_is_clustered_by_task():
  # Task means 1.0, 0.5, 0.0: std(ddof=1) = 0.5, / sqrt(3).
  assert metrics.standard_error([[1, 1], [1, 0], [0, 0]]) == pytest.approx(0.5 / math.sqrt(3))
  # One task: binomial sqrt(p (1 - p) / n) = sqrt(0.25 / 4).
  assert metrics.standard_error([[1, 0, 1, 0]]) == pytest.approx(0.25)


def _record(task, sample, score, infra=False, tokens=10):
  return {"task_id": task, "sample": sample, "score": None if infra else score,
          "category": task.upper(),
          "infra_error": "EndpointTimeout" if infra else None, "completion_tokens": tokens,
          "turns": 2, "tool_calls": 3, "wall_s": 1.0, "cost": 0.5, "finish_reason": "finish"}


def test_summarize_excludes_infra_errors_and_computes_pass_and_best_of_k():
  records = ([_record("a", s, float(s < 2)) for s in range(5)]  # c = 2 of 5
             + [_record("b", s, 0.0) for s in range(4)]
             + [_record("b", 4, None, infra=True, tokens=None)])
  out = metrics.summarize(records, ks=(1, 2, 5))
  overall, per_task = out["overall"], out["per_task"]
  assert overall["episodes"] == 9 and overall["infra_errors"] == 1
  assert overall["infra_error_tasks"] == ["b"]
  assert overall["accuracy"] == pytest.approx(2 / 9)
  assert per_task["a"]["pass@2"] == pytest.approx(0.7)
  assert per_task["b"]["pass@5"] is None  # only 4 non-infra samples
  assert overall["pass@5_tasks"] == 1 and overall["pass@5"] == 1.0
  assert overall["pass@1"] == pytest.approx((0.4 + 0.0) / 2)
  assert per_task["a"]["best_of_1"] == 1.0 and per_task["a"]["best_of_2"] == 1.0
  assert per_task["b"]["best_of_2"] == 0.0
  assert overall["completion_tokens"]["median"] == 10
  assert overall["total_cost"] == pytest.approx(0.5 * 10)  # infra attempts cost too
  assert overall["by_category"] == {
      "A": {"episodes": 5, "accuracy": 0.4, "tasks": 1, "infra_errors": 0},
      "B": {"episodes": 4, "accuracy": 0.0, "tasks": 1, "infra_errors": 1}}
  assert "by_language" not in overall  # no record names a language


def test_summarize_reports_accuracy_per_language():
  records = [dict(_record(t, s, score), language=language)
             for t, language, score in (("g1", "go", 1.0), ("g2", "go", 0.0),
                                        ("r1", "rust", 1.0), ("p1", None, 0.0))
             for s in range(2)]
  records.append(dict(_record("r2", 0, None, infra=True), language="rust"))
  by_language = metrics.summarize(records)["overall"]["by_language"]
  assert by_language == {
      "go": {"episodes": 4, "accuracy": 0.5, "tasks": 2, "infra_errors": 0},
      "rust": {"episodes": 2, "accuracy": 1.0, "tasks": 2, "infra_errors": 1},
      "None": {"episodes": 2, "accuracy": 0.0, "tasks": 1, "infra_errors": 0}}
