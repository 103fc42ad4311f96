"""Numerical parity with HF transformers: c2jax.model.forward on hf.load(fixture) must
reproduce the logits transformers computed for the same weights (tools/fixtures/make_hf_fixtures.py),
and, when an interpreter with torch + transformers is at hand, the live transformers output.
"""

from __future__ import annotations

import functools
import subprocess

import jax
import numpy as np
import pytest

from c2jax import model
from tests import torch_reference
from tests.hf.conftest import CASES, FIXTURES

TOLERANCE = 1e-4  # float32, batch 2 x 32 (the bound)
_ROOT = FIXTURES.parents[2]


@functools.cache
def _forward(case: str, loaded):
  """One jitted forward per case, compiled once and shared by the tests below."""
  return jax.jit(functools.partial(model.forward, loaded(case)[0]))


@functools.cache
def _logits(case: str, loaded) -> np.ndarray:
  tokens = np.load(FIXTURES / case / "tokens.npy")
  assert tokens.dtype == np.int32 and tokens.shape == (2, 32)
  return np.asarray(_forward(case, loaded)(loaded(case)[1], tokens))


def test_fixtures_cover_every_option(loaded):
  """The committed cases together exercise each option the parity claim is about."""
  cfgs = [loaded(case)[0] for case in CASES]
  mla = [c for c in cfgs if c.attention == "mla"]
  gqa = [c for c in cfgs if c.attention == "gqa"]
  assert any(c.moe.n_group > 1 and c.moe.topk_group < c.moe.n_group for c in mla)
  assert any(c.rope.scaling == "yarn" and c.rope.mscale != c.rope.mscale_all_dim for c in mla)
  assert any(c.first_k_dense > 0 for c in mla) and any(c.first_k_dense > 0 for c in gqa)
  assert any(c.moe.num_shared_experts > 1 for c in mla)
  assert any(c.q_lora_rank is None for c in mla) and any(c.q_lora_rank for c in mla)
  assert {c.rope.interleave for c in mla} == {True, False}
  gqa_moe = [c for c in gqa if c.first_k_dense < c.num_layers]
  assert all(c.qk_norm for c in gqa) and all(c.moe.router == "softmax" for c in gqa_moe)
  assert {c.moe.norm_topk_prob for c in gqa_moe} == {True, False}
  assert any(c.first_k_dense == c.num_layers for c in gqa)  # Qwen3 dense
  assert any(c.num_heads > c.num_kv_heads for c in gqa)


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers_fixture(case, loaded):
  expected = np.load(FIXTURES / case / "logits.npy")
  ours = _logits(case, loaded)
  assert ours.dtype == np.float32 and ours.shape == expected.shape
  diff = np.abs(ours - expected).max()
  assert diff <= TOLERANCE, f"{case}: max |c2jax - HF| = {diff:.3g} > {TOLERANCE}"


def test_fixture_is_sensitive_to_the_correction_bias(loaded):
  """Guards the fixture itself: the bias must change routing enough to fail parity."""
  case = "deepseek_v3_grouped_yarn"
  params = loaded(case)[1]
  bias = params["moe_layers"]["moe"]["router"]["correction_bias"]
  zeroed = jax.tree_util.tree_map(lambda x: x, params)
  zeroed["moe_layers"]["moe"]["router"]["correction_bias"] = np.zeros_like(bias)
  tokens = np.load(FIXTURES / case / "tokens.npy")
  ours = np.asarray(_forward(case, loaded)(zeroed, tokens))
  assert np.abs(ours - np.load(FIXTURES / case / "logits.npy")).max() > 100 * TOLERANCE


def test_logits_match_live_transformers(loaded, tmp_path):
  python = torch_reference.torch_python()
  for case in CASES:
    np.save(tmp_path / f"{case}.npy", _logits(case, loaded))
  result = subprocess.run(
      [python, str(_ROOT / "tools" / "fixtures" / "make_hf_fixtures.py"), "--verify",
       "--jax_logits", str(tmp_path)], capture_output=True, text=True, timeout=300,
      env=torch_reference.clean_env())
  assert result.returncode == 0, result.stdout + result.stderr
  assert result.stdout.count("c2jax vs live HF") == len(CASES), result.stdout
