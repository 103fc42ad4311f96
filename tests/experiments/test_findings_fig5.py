"""experiments/findings/fig5_pass_rate.py: held-out pass rate and best-of-K during RL."""

import json

import pytest

from experiments.findings import fig5_pass_rate as fig5
from findings_testlib import run_smoke


def _curve(points):
  return {step: {"pass_rate": p, "best_of_k": b, "episodes": 8} for step, p, b in points}


def test_summary_counts_seeds_that_rose():
  curves = [_curve([(0, 0.25, 0.5), (10, 0.375, 0.75)]),
            _curve([(0, 0.25, 0.5), (10, 0.125, 0.75)])]
  s = fig5.summarise(curves, samples=4)
  assert s["steps"] == [0, 10]
  assert s["delta"]["pass_rate"]["mean"] == pytest.approx(0.0)
  assert (s["delta"]["pass_rate"]["seeds_up"], s["delta"]["pass_rate"]["seeds_down"]) == (1, 1)
  assert s["delta"]["best_of_k"]["mean"] == pytest.approx(0.25)
  assert s["per_step"][10]["pass_rate"]["std"] == pytest.approx(0.1767767, rel=1e-5)
  assert s["both_rise"] is False and "does not reproduce" in s["verdict"]
  curves[1][10]["pass_rate"] = 0.5
  assert fig5.summarise(curves, samples=4)["both_rise"] is True


@pytest.mark.slow
def test_smoke_reads_the_evaluations_of_its_rl_run(tmp_path):
  numbers, workdir = run_smoke("fig5_pass_rate", tmp_path)
  run = workdir / "seed0"
  evals = sorted(int(p.name.split("_")[1]) for p in (run / "evals").glob("step_*"))
  assert numbers["steps"] == evals == [0, 1]
  rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  for step in evals:
    records = (run / "evals" / f"step_{step:06d}" / "results.jsonl").read_text().splitlines()
    point = numbers["curves"][0][str(step)]
    assert point["episodes"] == len(records) == 2  # 1 held-out task x 2 samples
    [row] = [r for r in rows if r["step"] == step and "eval/pass_rate" in r]
    assert point["pass_rate"] == row["eval/pass_rate"]
    assert point["best_of_k"] == row["eval/best_of_2"]
    assert numbers["per_step"][str(step)]["pass_rate"]["mean"] == point["pass_rate"]
  assert numbers["samples_k"] == 2 and numbers["init_from"] == "(random init)"
