"""experiments/findings/fig6_length_penalty.py: completion tokens by difficulty under the
length penalty."""

import json

import numpy as np
import pytest

from experiments.findings import fig6_length_penalty as fig6
from findings_testlib import run_smoke


def test_summary_agrees_only_when_easy_falls_more_than_hard():
  falls = [{0: {0: 100.0, 3: 200.0}, 10: {0: 80.0, 3: 210.0}},
           {0: {0: 120.0, 3: 180.0}, 10: {0: 90.0, 3: 170.0}}]
  s = fig6.summarise({"penalty": falls}, easy=0, hard=3)
  assert s["penalty"]["change"]["0"]["mean"] == pytest.approx((-0.2 - 0.25) / 2)
  assert s["penalty"]["change"]["0"]["seeds_down"] == 2
  assert s["penalty"]["change"]["3"]["mean"] == pytest.approx((0.05 - 1 / 18) / 2)
  assert s["agrees"] is True and "Agrees" in s["verdict"]
  both_fall = [{0: {0: 100.0, 3: 200.0}, 10: {0: 90.0, 3: 100.0}}]
  assert fig6.summarise({"penalty": both_fall}, easy=0, hard=3)["agrees"] is False
  assert fig6.summarise({"none": falls}, easy=0, hard=3)["agrees"] is None


def test_difficulty_comes_from_the_task_id():
  assert fig6._difficulty("procgen-d3-1000001") == 3
  with pytest.raises(ValueError, match="no procgen difficulty"):
    fig6._difficulty("swebench-foo")


@pytest.mark.slow
def test_smoke_measures_tokens_by_difficulty_from_its_run(tmp_path):
  numbers, workdir = run_smoke("fig6_length_penalty", tmp_path, "--arms", "penalty",
                               "--easy", "1", "--hard", "2", "--penalty-scale", "0.01")
  run = workdir / "penalty_seed0"
  config = json.loads((run / "config.json").read_text())
  assert config["rl"]["reward"]["length_penalty"]["scale"] == 0.01
  assert sorted(config["tasks"]["difficulties"]) == [1, 2]
  [curve] = numbers["heldout_curves"]["penalty"]
  assert sorted(curve) == ["0", "1"]
  for step, per_difficulty in curve.items():
    records = [json.loads(line) for line in
               (run / "evals" / f"step_{int(step):06d}" / "results.jsonl").read_text().splitlines()]
    for d in (1, 2):
      tokens = [r["completion_tokens"] for r in records if f"-d{d}-" in r["task_id"]]
      assert per_difficulty[str(d)] == pytest.approx(np.mean(tokens))
  [train] = numbers["train_curves"]["penalty"]
  assert len(train["bin_end_step"]) == 4 and set(train) >= {"1", "2"}
  assert numbers["agrees"] in (True, False)
