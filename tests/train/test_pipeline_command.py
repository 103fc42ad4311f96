"""The README's main job, `c2jax pipeline`, runs every stage end to end (shortened)."""

import json

import pytest

from train_testlib import run_pipeline, run_rl_pipeline

pytestmark = pytest.mark.slow


# What libtpu prints when JAX starts on a machine without a TPU, unless c2jax keeps it
# quiet (c2jax._quiet_absent_tpu): a new user reads it as a broken install.
LIBTPU_NOISE = ("E0000", "INVALID_ARGUMENT", "Failed to find host bounds",
                "could not determine TPU")


def test_pipeline_runs_every_stage_and_resumes(tmp_path, data_cache):
  root = tmp_path / "pipe"
  result = run_pipeline(root, data_cache)  # as the README's command runs, from a shell
  noise = [line for line in (result.stdout + result.stderr).splitlines()
           if any(mark in line for mark in LIBTPU_NOISE)]
  assert not noise, "the pipeline's output holds libtpu's start-up errors:\n" + "\n".join(noise)
  summary = json.loads((root / "summary.json").read_text())
  assert list(summary) == ["pretrain", "longctx", "traces", "sft", "eval"]
  assert summary["traces"] == {"train_traces": 2, "heldout_traces": 1,
                               "seconds": summary["traces"]["seconds"]}
  for stage in ("pretrain", "longctx", "sft"):
    assert summary[stage]["steps"] == 2 and summary[stage]["eval"]["eval_loss"] > 0
  assert f"init: parameters from {root}/pretrain/checkpoints step 2" in result.stdout
  assert f"init: parameters from {root}/longctx/checkpoints step 2" in result.stdout
  # Every stage used the one shared tokenizer: SFT started from the long-context weights.
  config = json.loads((root / "sft" / "config.json").read_text())
  assert config["data"]["vocab_size"] == 1024 and config["init_from"] == str(root / "longctx")
  # The eval stage scored the SFT run on the engine, as `c2jax eval` would in WORKDIR/eval.
  scored = summary["eval"]
  assert scored["suite"] == "procgen" and scored["run"] == str(root / "sft")
  assert scored["eval"]["tasks"] == 2 and scored["eval"]["episodes"] == 2
  assert 0.0 <= scored["eval"]["accuracy"] <= 1.0 and scored["eval"]["infra_errors"] == 0
  records = (root / "eval" / "results.jsonl").read_text().splitlines()
  assert len(records) == 2 and all(json.loads(r)["policy"] == "sft" for r in records)
  assert "eval sft" in result.stderr  # the runner's progress bar
  rerun = run_pipeline(root, data_cache)
  # Finished stages are not run again, and the rerun reports what each of them recorded.
  assert "resume:" not in rerun.stdout and "eval sft" not in rerun.stderr
  for stage in ("pretrain", "longctx", "sft"):
    assert f"{stage}: finished (step 2); recorded result" in rerun.stdout
  assert "eval: finished (sft at step 2); recorded result" in rerun.stdout
  assert json.loads((root / "summary.json").read_text()) == summary


def test_pipeline_ends_in_rl_from_the_sft_checkpoint(tmp_path, data_cache):
  root = tmp_path / "agent"
  result = run_rl_pipeline(root, data_cache)
  summary = json.loads((root / "summary.json").read_text())
  assert list(summary) == ["traces", "sft", "rl"]
  rl = summary["rl"]
  assert rl["step"] == 1 and rl["init_from"] == str(root / "sft")
  assert 0.0 <= rl["eval"]["pass_rate"] <= 1.0 and list(rl["evals"]) == ["1"]
  assert f"init: parameters from {root}/sft/checkpoints step 2" in result.stdout
  # The RL run is `c2jax rl`'s: its metrics, checkpoints and held-out eval are in WORKDIR/rl.
  rows = [json.loads(line) for line in (root / "rl" / "metrics.jsonl").read_text().splitlines()]
  assert [r["eval/pass_rate"] for r in rows if "eval/pass_rate" in r] == [rl["eval"]["pass_rate"]]
  assert (root / "rl" / "evals" / "step_000001").is_dir()
  rerun = run_rl_pipeline(root, data_cache)
  assert "rl: finished (step 1); recorded result" in rerun.stdout
  assert "sft: finished (step 2); recorded result" in rerun.stdout
  assert json.loads((root / "summary.json").read_text()) == summary
