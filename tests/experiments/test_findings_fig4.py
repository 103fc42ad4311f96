"""experiments/findings/fig4_kl_estimators.py: the KL-estimator figure as a findings command."""

import numpy as np

from findings_testlib import run_smoke


def test_smoke_writes_the_estimator_numbers(tmp_path):
  numbers, _ = run_smoke("fig4_kl_estimators", tmp_path)
  deltas = np.array(numbers["deltas"])
  assert numbers["samples"] == 20_000
  for name in ("k1", "k2", "k3"):
    variance = np.array(numbers["variance"][name]["mean"])
    assert variance.shape == deltas.shape and variance[0] == 0.0  # delta 0: r == 1 exactly
    closed = np.array(numbers["closed_form_variance"][name])
    # Monte-Carlo within 20% of the closed form where the tail is still sampled.
    near = (deltas > 0) & (deltas <= 1.0)
    np.testing.assert_allclose(variance[near], closed[near], rtol=0.2)
  small = int(np.argmin(np.abs(deltas - numbers["at_small_delta"]["delta"])))
  assert numbers["at_small_delta"]["k3"] == numbers["variance"]["k3"]["mean"][small]
  std_norm = numbers["std_normalisation"]
  assert len(std_norm["grpo_max_abs"]) == len(std_norm["spreads"])
  assert numbers["agrees"] is True and "Agrees" in numbers["verdict"]
