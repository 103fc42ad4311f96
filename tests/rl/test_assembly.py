"""Group assembly, rank-balanced packing and the curriculum sampler, by hand."""

import numpy as np
import pytest

from c2jax import rl
from c2jax.rl.tasks import curriculum
from c2jax.rl.queue import groups
from c2jax.rl.learner import packing
from c2jax.rl.rewards.terms import TrajectoryStats


def _chain(passed, segment_lengths, version):
  segments = [{"tokens": np.arange(n, dtype=np.int32), "loss_mask": np.ones(n, np.float32)}
              for n in segment_lengths]
  return groups.Chain(segments, TrajectoryStats(tests_passed=passed, tests_total=1),
                      version)


def test_assemble_group_rewards_advantages_and_segments():
  cfg = rl.default_config()
  cfg.group_size = 3
  for name in ("length_penalty", "tool_call_errors", "unfinished_todos", "shell_only"):
    cfg.reward[name].scale = 0.0
  chains = [_chain(1, [4, 2], 7), _chain(0, [3], 5), _chain(0, [5, 1, 1], 6)]
  group, metrics = groups.assemble_group(cfg, "p1", chains)
  np.testing.assert_allclose(group.rewards_G, [1, 0, 0])
  np.testing.assert_allclose(group.advantages_G, [2 / 3, -1 / 3, -1 / 3], rtol=1e-6)
  np.testing.assert_array_equal(group.segment_chain_S, [0, 0, 1, 2, 2, 2])
  assert group.policy_version == 5 and len(group.segments) == 6
  np.testing.assert_allclose(groups.per_segment(group.advantages_G, group.segment_chain_S),
                             [2 / 3, 2 / 3, -1 / 3, -1 / 3, -1 / 3, -1 / 3], rtol=1e-6)
  np.testing.assert_allclose(metrics["pass_rate"], 1 / 3)
  assert metrics["segments_per_chain"] == 2.0
  with pytest.raises(ValueError, match="group_size = 3"):
    groups.assemble_group(cfg, "p2", chains[:2])


def test_balance_accounts_for_attention_cost():
  lengths = [100, 60, 60, 10]  # linear cost: {100, 10} vs {60, 60} = 110 vs 120
  assert packing.balance_across_ranks(lengths, 2, 0.0) == [[0, 3], [1, 2]]
  # with c = 0.1: costs 1100, 420, 420, 20: 100 alone outweighs 60 + 60 + ...
  assigned = packing.balance_across_ranks(lengths, 2, 0.1)
  assert assigned == [[0, 3], [1, 2]]
  loads = [packing.sequence_cost([lengths[i] for i in r], 0.1).sum() for r in assigned]
  np.testing.assert_allclose(loads, [1120, 840])
  # At most ceil(5 / 2) = 3 rows per rank: the 1000 shares its rank with one 1.
  assert packing.balance_across_ranks([1000, 1, 1, 1, 1], 2, 0.0) == [[0, 4], [1, 2, 3]]


def test_quadratic_term_changes_the_assignment():
  lengths = [70, 60, 50, 40, 30]
  # Linear: 70->r0, 60->r1, 50->r1 (110), 40->r0 (110), 30->r0 on the tie (140 vs 110).
  linear = packing.balance_across_ranks(lengths, 2, 0.0)
  assert linear == [[0, 3, 4], [1, 2]]
  # Quadratic (c = 1), costs 4970, 3660, 2550, 1640, 930: the last goes to r1 instead.
  quadratic = packing.balance_across_ranks(lengths, 2, 1.0)
  assert quadratic == [[0, 3], [1, 2, 4]]
  cost = lambda assignment: [packing.sequence_cost([lengths[i] for i in r], 1.0).sum()
                             for r in assignment]
  np.testing.assert_allclose(cost(linear), [7540, 6210])
  np.testing.assert_allclose(cost(quadratic), [6610, 7140])


def test_pack_batch_is_rank_major_and_padded():
  segments = [{"tokens": np.full(n, n, np.int32), "router": np.ones((n, 2), np.int32)}
              for n in (5, 1, 3)]
  batch, metrics = packing.pack_batch(segments, [0.5, -1.0, 2.0], num_ranks=2, seq_len=6,
                                      attention_cost=0.0)
  # Costs 5, 1, 3 and 2 rows per rank: 5 -> r0, 3 -> r1, 1 -> r1 (3 < 5); r0 padded.
  np.testing.assert_array_equal(batch["row_sequence"], [0, -1, 2, 1])
  np.testing.assert_array_equal(batch["tokens"][0], [5, 5, 5, 5, 5, 0])
  np.testing.assert_array_equal(batch["tokens"][1], 0)
  np.testing.assert_array_equal(batch["tokens"][3], [1, 0, 0, 0, 0, 0])
  assert batch["router"].shape == (4, 6, 2)
  assert batch["router"][2, :4, 0].tolist() == [1, 1, 1, 0]
  np.testing.assert_allclose(batch["advantages"], [0.5, 0.0, 2.0, -1.0])
  np.testing.assert_allclose(metrics["rank_imbalance"], 5 / 4.5)
  with pytest.raises(ValueError, match="seq_len = 4"):
    packing.pack_batch(segments, [0, 0, 0], 2, 4, 0.0)


def test_curriculum_difficulty_and_weighted_draws():
  sampler = curriculum.CurriculumSampler(["a", "b", "c"], strength=1.0)
  sampler.observe("a", turns=3, thinking_tokens=300)
  sampler.observe("b", turns=1, thinking_tokens=100)
  # means 2 turns, 200 tokens: d(a) = (1.5 + 1.5) / 2, d(b) = 0.5, d(c) unobserved = 1.
  assert [sampler.difficulty(p) for p in "abc"] == [1.5, 0.5, 1.0]
  firsts = []
  for seed in range(3000):
    s = curriculum.CurriculumSampler(["a", "b", "c"], strength=1.0, seed=seed)
    s.observe("a", 3, 300)
    s.observe("b", 1, 100)
    firsts.append(s.draw(1)[0])
  np.testing.assert_allclose(firsts.count("a") / 3000, 0.5, atol=0.03)
  np.testing.assert_allclose(firsts.count("b") / 3000, 1 / 6, atol=0.03)


def test_curriculum_is_single_epoch():
  sampler = curriculum.CurriculumSampler([f"p{i}" for i in range(5)] + ["p0"], strength=2.0)
  drawn = sampler.draw(2) + sampler.draw(10)
  assert sorted(drawn) == [f"p{i}" for i in range(5)]
  assert sampler.draw(1) == [] and len(sampler) == 0
