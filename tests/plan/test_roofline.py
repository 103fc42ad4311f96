"""Rooflines: the FLOP and byte formulas against hand counts, the bounds, and the command."""

import json
import os
import subprocess
import sys

import pytest

from c2jax.model import variants
from c2jax.plan import accelerators, roofline

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# tiny, by hand from its shapes (hidden 64, vocab 8192, 4 heads, q_lora 32, kv_lora 32,
# nope 16, rope 8, v 16, one dense layer of width 192, one MoE layer: 8 experts of width
# 32, top-2, one shared expert of width 32).
_ATTENTION = 64 * 32 + 32 * 4 * 24 + 64 * (32 + 8) + 32 * 4 * (16 + 16) + 4 * 16 * 64
_DENSE = 2 * _ATTENTION + 3 * 64 * 192 + 64 * 8192 + 64 * 8 + 3 * 64 * 32
_ROUTED = 8 * 3 * 64 * 32


def test_parameter_groups_match_a_hand_count():
  groups = roofline.param_groups(variants.get("tiny"))
  assert (groups.dense_matmul, groups.routed, groups.mtp_matmul, groups.moe_layers) == (
      _DENSE, _ROUTED, 0, 1)


def test_train_flops_per_token_match_the_hand_formula():
  seq_len = 128
  attention = 2 * 2 * 4 * (16 + 8 + 16) * (seq_len + 1) / 2  # 2 layers, 4 heads
  forward = 2 * (_DENSE + _ROUTED * 2 / 8) + attention
  assert roofline.train_flops_per_token(variants.get("tiny"), seq_len) == 3 * forward


def test_decode_bytes_count_touched_experts_and_the_latent_cache():
  cfg = variants.get("tiny")
  one = roofline.decode_step_cost(cfg, batch=1, context=100)
  # One sequence touches exactly its 2 experts per layer; the MLA cache holds
  # kv_lora + rope = 40 float32 values per token and layer.
  assert one.bytes_moved == (_DENSE + _ROUTED * 2 / 8) * 4 + 100 * 2 * 40 * 4
  many = roofline.decode_step_cost(cfg, batch=64, context=100, devices=2)
  touched = 8 * (1 - (1 - 2 / 8) ** 64)
  assert many.bytes_moved == pytest.approx(
      ((_DENSE + _ROUTED * touched / 8) * 4 + 64 * 100 * 2 * 40 * 4) / 2)
  absorbed = 2 * 2 * 4 * (2 * 32 + 8) * 100  # scores + values over the latent
  assert many.model_flops == pytest.approx(64 * (2 * (_DENSE + _ROUTED / 4) + absorbed) / 2)


def test_bounds_take_the_slowest_resource():
  acc = accelerators.Accelerator("toy", bf16_tflops=1.0, fp8_tflops=None, hbm_tb_s=0.5,
                                 memory_gb=1, link_gb_s=100.0)
  cost = roofline.StepCost("s", devices=1, tokens=10, model_flops=0.5e12, xla_flops=1e12,
                           bytes_moved=1e12, comm_bytes=1e11)
  b = roofline.bound(cost, acc)
  assert (b.compute_s, b.memory_s, b.comm_s) == (1.0, 2.0, 1.0)
  assert b.lower_s == 2.0 and b.bound_by == "memory" and b.mfu_ceiling == 0.25
  with pytest.raises(ValueError, match="no FP8"):
    acc.peak_flops("fp8")


def test_every_accelerator_has_sane_published_peaks():
  for acc in accelerators.ACCELERATORS.values():
    assert 100 < acc.bf16_tflops < 5000 and 0.5 < acc.hbm_tb_s < 10
    assert acc.fp8_tflops is None or acc.fp8_tflops == pytest.approx(2 * acc.bf16_tflops,
                                                                      rel=1e-3)


@pytest.mark.slow
def test_plan_roofline_compiles_and_measures_on_this_machine():
  command = [sys.executable, "-m", "c2jax.cli", "plan", "--config=configs/pretrain.py:tiny",
             "--config.train.seq_len=32", "--config.train.batch_size=2", "--roofline",
             "--measure", "--decode_batch=2", "--decode_context=16"]
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": REPO})
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  train, decode = report["roofline"]
  assert set(train["bounds"]) == {*accelerators.ACCELERATORS, "this"}
  expected = roofline.train_flops_per_token(variants.get("tiny"), 32) * 64
  assert train["model_flops"] == pytest.approx(expected)
  # XLA counts the same matmuls plus elementwise work: more, but not wildly more.
  assert 1.0 < train["xla_flops"] / train["model_flops"] < 2.0
  assert train["measured_s"] > 0 and decode["measured_s"] > 0
  # The table sets each measured step beside its bound on this machine (whose peaks are
  # measured in the same run, so on a busy machine a step may even beat them).
  rows = [line for line in result.stdout.splitlines() if line.startswith("this cpu")]
  for step, row in zip((train, decode), rows, strict=True):
    ratio = step["measured_s"] / step["bounds"]["this"]["lower_bound_s"]
    assert row.split()[-1] == f"{ratio:.2f}x", row
  assert "TPU v5p" in result.stdout
