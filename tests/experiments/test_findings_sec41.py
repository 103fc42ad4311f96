"""experiments/findings/sec41_advantages.py: std-normalised advantages against Dr. GRPO on
groups of rollouts."""

import numpy as np
import pytest

from c2jax.rl.queue.group_store import Group
from experiments.findings import sec41_advantages as sec41
from findings_testlib import run_smoke
EPS = 1e-6


def _group(gid, rewards, solved):
  return Group(gid, 0, np.asarray(rewards, np.float32), np.zeros(len(rewards), np.float32),
               [], np.zeros(0, np.int32), {"solved": solved})


def test_degenerate_groups_get_unit_advantages_under_grpo_only():
  rng = np.random.default_rng(0)
  groups = [
      # All failed: rewards differ only by a length penalty of a few thousandths.
      _group("fail", -0.003 * rng.random(8), [False] * 8),
      _group("pass", 1 - 0.002 * rng.random(8), [True] * 8),
      _group("mixed", np.array([1, 0, 1, 0, 0, 1, 0, 0]) - 0.002 * rng.random(8),
             [True, False, True, False, False, True, False, False]),
  ]
  rows = sec41.group_table(groups, EPS)
  a = sec41.analyse(rows, EPS)
  assert (a["groups"], a["degenerate_groups"], a["mixed_groups"]) == (3, 2, 1)
  # grpo rescales every group to unit std, whatever its spread.
  assert a["grpo_unit_std_groups"] == 3 and a["grpo_max_abs_std_minus_1"] < 0.011
  for row in rows:
    expected = 1.0 / (row["reward_std"] + EPS)
    assert row["mean_abs_grpo"] / row["mean_abs_dr_grpo"] == pytest.approx(expected, rel=1e-3)
  assert a["amplification"]["max_relative_error_vs_1_over_std"] < 1e-3
  # So two noise-only groups carry about 2/3 of grpo's weight, almost none of dr_grpo's.
  assert a["share_of_abs_advantage_on_degenerate_grpo"] == pytest.approx(2 / 3, abs=0.1)
  assert a["share_of_abs_advantage_on_degenerate_dr_grpo"] < 0.01
  # Each noise-only group moves the policy about as much as a group with one real success
  # under grpo; under dr_grpo by a few thousandths of that.
  weight = a["noise_weight_vs_one_success"]
  assert weight["grpo"]["n"] == 2 and weight["grpo"]["min"] > 0.5
  assert weight["dr_grpo"]["max"] < 0.01
  assert a["one_success_mean_abs_dr_grpo"] == pytest.approx(2 * 7 / 64)
  agrees, text = sec41.verdict(a)
  assert agrees is True and "2 of 3 groups are degenerate" in text


def test_no_spread_and_no_degenerate_groups_are_reported_as_such():
  same = sec41.analyse(sec41.group_table([_group("a", [0.5] * 4, [False] * 4)], EPS), EPS)
  assert sec41.verdict(same)[0] is None
  mixed = sec41.analyse(sec41.group_table([_group("m", [1, 0], [True, False])], EPS), EPS)
  assert mixed["degenerate_groups"] == 0
  assert sec41.verdict(mixed) == (None, "no degenerate group among the rollouts: the case "
                                  "the report warns about did not occur here.")
  with pytest.raises(ValueError, match="no per-rollout `solved`"):
    sec41.group_table([Group("x", 0, np.zeros(2, np.float32), np.zeros(2, np.float32), [],
                             np.zeros(0, np.int32), {})], EPS)


@pytest.mark.slow
def test_smoke_analyses_the_groups_of_its_own_rl_run(tmp_path):
  numbers, workdir = run_smoke("sec41_advantages", tmp_path)
  run = workdir / "seed0"
  queued = sorted(p.name.split(".", 2)[2][:-4] for state in ("trained", "claimed", "ready",
                                                             "stale")
                  for p in (run / "queue" / state).glob("*.npz"))
  assert numbers["runs"] == [str(run)]
  assert numbers["groups"] == len(queued) >= 1
  assert sorted(r["group"] for r in numbers["per_group"]) == queued
  assert all(r["size"] == 4 for r in numbers["per_group"])
  assert numbers["degenerate_groups"] + numbers["mixed_groups"] == numbers["groups"]
