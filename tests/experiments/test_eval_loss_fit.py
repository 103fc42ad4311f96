"""The log-linear eval-loss fit recovers a known law and reads a run's metrics."""

import json

import numpy as np
import pytest

from experiments.findings import eval_loss_fit as fit_lib


def test_recovers_exact_law():
  tokens = np.array([1e3, 1e4, 1e5, 1e6])
  fit = fit_lib.log_linear_fit(tokens, 7.0 - 0.25 * np.log(tokens))
  assert fit["slope"] == pytest.approx(-0.25)
  assert fit["intercept"] == pytest.approx(7.0)
  assert fit["r2"] == pytest.approx(1.0)


def test_noise_lowers_r2_and_too_few_points_fail():
  tokens = np.array([1e3, 1e4, 1e5, 1e6])
  fit = fit_lib.log_linear_fit(tokens, 7.0 - 0.25 * np.log(tokens) + [0.3, -0.3, 0.3, -0.3])
  assert fit["r2"] < 0.95
  with pytest.raises(ValueError, match="at least 3 eval points"):
    fit_lib.log_linear_fit(tokens[:2], np.array([2.0, 1.0]))


def test_reads_tokens_from_run(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"train": {"batch_size": 2,
                                                              "seq_len": 8}}))
  rows = [{"step": 0, "eval_loss": 9.0}, {"step": 1, "loss": 5.0},
          {"step": 10, "eval_loss": 4.0}, {"step": 20, "eval_loss": 3.5}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  tokens, loss = fit_lib.eval_points(tmp_path)
  assert tokens.tolist() == [160.0, 320.0]  # step 0 has no log; train rows are skipped
  assert loss.tolist() == [4.0, 3.5]
