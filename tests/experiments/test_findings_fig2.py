"""experiments/findings/fig2_cpt_to_rl.py: CPT levels -> SFT -> RL, loss against reward."""

import csv
import json

import pytest

from experiments.findings import fig2_cpt_to_rl as fig2
from findings_testlib import run_smoke


def _row(level, seed, cpt_loss, sft_loss, reward):
  return {"cpt_steps": level, "cpt_compute": 6.0 * level, "cpt_loss": cpt_loss,
          "sft_loss": sft_loss, "rl_reward": reward, "seed": seed, "heldout_pass_rate": 0.0}


def test_summary_correlates_loss_with_reward():
  rows = [_row(10, 0, 5.0, 3.0, 0.1), _row(30, 0, 4.0, 2.5, 0.2), _row(90, 0, 3.0, 2.0, 0.4),
          _row(10, 1, 5.2, 3.1, 0.1), _row(30, 1, 4.1, 2.4, 0.25), _row(90, 1, 3.1, 2.1, 0.35)]
  s = fig2.summarise(rows, [10, 30, 90])
  assert s["corr_sft_loss_rl_reward"] < -0.9 and s["agrees"] is True
  assert s["cpt_loss_falls_with_compute"] is True
  assert s["per_level"][30]["rl_reward"]["mean"] == pytest.approx(0.225)
  flat = [dict(r, rl_reward=0.0) for r in rows]
  s = fig2.summarise(flat, [10, 30, 90])
  assert s["corr_sft_loss_rl_reward"] is None and s["agrees"] is False
  assert "undefined" in s["verdict"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  """The --smoke run: two CPT levels (1 and 2 steps), each -> SFT -> RL."""
  tmp_path = tmp_path_factory.mktemp("fig2")
  numbers, workdir = run_smoke("fig2_cpt_to_rl", tmp_path, timeout=1500)
  return tmp_path, numbers, workdir


@pytest.mark.slow
def test_smoke_runs_every_level_and_writes_the_table(smoke):
  tmp_path, numbers, workdir = smoke
  out = tmp_path / "out"
  rows = [json.loads(line) for line in (out / "cpt_to_rl.jsonl").read_text().splitlines()]
  with open(out / "cpt_to_rl.csv") as f:
    csv_rows = list(csv.DictReader(f))
  assert [r["cpt_steps"] for r in rows] == [1, 2] == numbers["levels"]
  assert [int(r["cpt_steps"]) for r in csv_rows] == [1, 2]
  assert list(rows[0])[:6] == ["cpt_steps", "cpt_compute", "cpt_loss", "sft_loss",
                               "rl_reward", "seed"]
  # Compute is proportional to the CPT steps; each loss is the run's own last eval.
  assert rows[1]["cpt_compute"] == pytest.approx(2 * rows[0]["cpt_compute"])
  for row in rows:
    for key, run in (("cpt_loss", row["cpt_run"]), ("sft_loss", row["sft_run"])):
      evals = [json.loads(line)["eval_loss"] for line in
               open(f"{run}/metrics.jsonl") if "eval_loss" in line]
      assert row[key] == evals[-1]
    rewards = [json.loads(line) for line in open(f"{row['rl_run']}/metrics.jsonl")]
    assert row["rl_reward"] == [r["reward"] for r in rewards if "reward" in r][-1]
  assert (workdir / "traces" / "train.jsonl").exists()


@pytest.mark.slow
def test_from_checkpoints_uses_existing_runs_as_the_levels(smoke, tmp_path):
  # --from-checkpoints: existing runs as the levels (here the smoke's two CPT runs, steps
  # 1 and 2); each level's losses are its run's own at that step, and RL starts from it.
  first, _, _ = smoke
  rows = [json.loads(line) for line in
          (first / "out" / "cpt_to_rl.jsonl").read_text().splitlines()]
  runs = ",".join(row["cpt_run"] for row in rows)
  again, _ = run_smoke("fig2_cpt_to_rl", tmp_path, "--from-checkpoints", runs, timeout=900)
  assert again["levels"] == [1, 2] and again["from_checkpoints"] == runs.split(",")
  for row, before in zip(again["rows"], rows):
    assert row["sft_loss"] == before["cpt_loss"] and row["sft_loss_source"] == "metrics"
    assert row["cpt_compute"] == pytest.approx(before["cpt_compute"])
    assert row["rl_run"].endswith(f"rl_step{row['cpt_steps']}_seed0")
