"""`c2jax plan --count`: parameter counts from abstract shapes for the real variants."""

import json
import math
import subprocess
import sys

import pytest

from c2jax.model import counting, variants


@pytest.mark.parametrize("name, total_b, active_b", [
    ("kimi_k25", 1040, 32.0),
    ("deepseek_v3", 671, 37.0),
    ("qwen3_moe_30b_a3b", 30.5, 3.3),
])
def test_real_variant_counts(name, total_b, active_b):
  counts = counting.count_params(variants.get(name))
  assert counts["total_params"] == pytest.approx(total_b * 1e9, rel=0.02)
  assert counts["active_params"] == pytest.approx(active_b * 1e9, rel=0.04)


def test_tiny_count_matches_hand_formula():
  cfg = variants.get("tiny")
  counts = counting.count_params(cfg)
  d, v, h = cfg.hidden_size, cfg.vocab_size, cfg.num_heads
  qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
  attn = (d * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * h * qk
          + d * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank
          + cfg.kv_lora_rank * h * (cfg.qk_nope_head_dim + cfg.v_head_dim)
          + h * cfg.v_head_dim * d + 2 * d)  # + attn_norm and mlp_norm scales
  dense = attn + 3 * d * cfg.intermediate_size
  e, fe, k = cfg.moe.num_experts, cfg.moe.intermediate_size, cfg.moe.num_experts_per_tok
  shared = 3 * d * fe * cfg.moe.num_shared_experts
  moe_layer = attn + d * e + e + 3 * e * d * fe + shared
  outer = 2 * v * d + d
  assert counts["total_params"] == outer + dense + moe_layer
  assert counts["active_params"] == outer + dense + moe_layer - 3 * (e - k) * d * fe
  assert 1e6 <= counts["total_params"] <= 5e6


def test_small_is_demo_size():
  total = counting.count_params(variants.get("small"))["total_params"]
  assert 50e6 <= total <= 100e6


def test_cli_prints_one_json_object():
  out = subprocess.run(
      [sys.executable, "-m", "c2jax.cli", "plan", "--config=configs/models.py:kimi_k25",
       "--count"], capture_output=True, text=True, check=True, cwd=_repo_root())
  result = json.loads(out.stdout)
  assert math.isclose(result["total_params"], 1.04e12, rel_tol=0.02)
  assert result["active_params"] < result["total_params"] / 20


def _repo_root():
  import pathlib
  return pathlib.Path(__file__).resolve().parents[2]
