"""Sharding plans from logical axes and mesh sizes alone (no devices)."""

import json
import math
import subprocess
import sys

import pytest

from c2jax import parallel
from c2jax.model import variants
from c2jax.plan import shardings as plan


@pytest.fixture(scope="module")
def tiny_plans():
  cfg = variants.get("tiny")
  par = parallel.default_parallel_config()
  par.mesh.fsdp, par.mesh.expert = 4, 2
  return {p.path: p for p in plan.param_plans(cfg, par, num_devices=8)}, cfg


def test_experts_split_over_expert_and_fsdp(tiny_plans):
  plans, cfg = tiny_plans
  gate = plans["moe_layers/moe/experts/gate_proj"]
  e, d, f = cfg.moe.num_experts, cfg.hidden_size, cfg.moe.intermediate_size
  assert gate.shape == (1, e, d, f)
  assert gate.mesh_axes[1] == "expert"
  assert gate.shard_shape == (1, e // 2, d // 4, f)  # embed: fsdp only, expert is taken
  # Dense parameters shard 'embed' over fsdp and expert together (8 ways).
  assert plans["moe_layers/attn_norm/scale"].shard_shape == (1, d // 8)
  assert plans["embed/embedding"].shard_shape == (cfg.vocab_size, d // 8)
  # MLA up-projections shard their latent dimension instead of being replicated.
  q_b = plans["moe_layers/attn/q_b_proj/kernel"]
  assert q_b.shard_shape[1] == cfg.q_lora_rank // 4  # fsdp (+ context), not expert


def test_summary_counts_bytes(tiny_plans):
  plans, _ = tiny_plans
  summary = plan.summarize(list(plans.values()))
  total = sum(math.prod(p.shape) * 4 for p in plans.values())  # float32
  assert summary["param_bytes_total"] == total
  assert total / 8 <= summary["param_bytes_per_device"] < total / 2
  assert summary["uneven"] == []


def test_uneven_dimension_is_reported():
  cfg = variants.get("tiny", hidden_size=60, num_heads=4)
  par = parallel.default_parallel_config()
  par.mesh.fsdp = 8
  plans = {p.path: p for p in plan.param_plans(cfg, par, num_devices=8)}
  norm = plans["final_norm/scale"]
  assert norm.uneven and norm.shard_shape == (8,)  # ceil(60 / 8)
  assert "final_norm/scale" in plan.summarize(list(plans.values()))["uneven"]


def test_cli_plans_kimi_on_a_thousand_devices():
  result = subprocess.run(
      [sys.executable, "-m", "c2jax.cli", "plan", "--config=configs/pretrain.py:kimi_k25",
       "--shardings", "--devices=1024"], capture_output=True, text=True, check=True)
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["mesh"] == {"data": 1, "fsdp": 64, "expert": 8, "context": 2, "tensor": 1}
  assert summary["param_bytes_total"] == pytest.approx(4 * 1.026e12, rel=0.01)  # fp32 masters
  assert summary["param_gib_per_device"] == pytest.approx(
      summary["param_bytes_total"] / 1024 / 2**30, rel=0.05)
  assert "moe_layers/moe/experts/gate_proj" in result.stdout
