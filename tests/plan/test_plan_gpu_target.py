"""`c2jax plan --target=h100-8`: GPU target names, the chip description XLA's GPU compiler
reads, the error without the CUDA plugin, and (where an interpreter with the plugin is
named) the tiny train step, Mosaic GPU kernels included, compiled by XLA's GPU compiler
for compile-only H100s."""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from c2jax.plan import shardings as plan
from c2jax.plan import topologies

REPO = pathlib.Path(__file__).resolve().parents[2]
ENV = "C2JAX_GPU_COMPILE_PYTHON"
HOW = (f"no .venv-gpu in the checkout (`bash tools/setup_gpu_compile.sh` builds it; "
       f"tools/setup.sh does) and {ENV} unset (a Python with c2jax and its gpu-compile "
       f"extra)")


@pytest.mark.parametrize("name, gpus, topology, kind", [
    ("h100-1", 1, "1x1x1", "H100 SXM"),
    ("h100-4", 4, "1x1x4", "H100 SXM"),
    ("h100-8", 8, "1x1x8", "H100 SXM"),
    ("H100-16", 16, "1x2x8", "H100 SXM"),
    ("h200-64", 64, "1x8x8", "H200 SXM"),
    ("b200-8", 8, "1x1x8", "B200"),
])
def test_gpu_names_give_nodes_of_eight(name, gpus, topology, kind):
  target = topologies.parse_target(name)
  assert (target.num_devices, target.topology_name, target.accelerator.name) == (
      gpus, topology, kind)
  assert target.compiler == "GPU compiler" and not target.has_cost_model


@pytest.mark.parametrize("name, slices, error", [
    ("h100-3", 1, r"1, 2 or 4 on one node, else whole nodes of 8"),
    ("h100-12", 1, r"whole nodes of 8 \(e\.g\. h100-8, h100-32\)"),
    ("h100-8", 2, r"slices are TPU multi-slice"),
    ("a100-8", 1, r"e\.g\. h100-8, h200-8, b200-8"),
])
def test_bad_gpu_names_say_what_is_expected(name, slices, error):
  with pytest.raises(ValueError, match=error):
    topologies.parse_target(name, slices)


def test_the_chip_description_carries_the_datasheet():
  text = topologies.GPUS["b200"].target_config((9, 10, 2))
  fields = dict(re.findall(r"^\s*(\w+): ([\w.\"]+)$", text, re.M))
  assert fields["core_count"] == "148" and fields["device_memory_size"] == str(180 * 10**9)
  assert fields["memory_bandwidth"] == str(8 * 10**12)
  assert "cuda_compute_capability { major: 10 minor: 0 }" in text
  assert 'platform_name: "CUDA"' in text and 'device_description_str: "NVIDIA B200"' in text
  assert "dnn_version_info { major: 9 minor: 10 patch: 2 }" in text
  assert text.count("{") == text.count("}")


def _has_cuda_plugin() -> bool:
  try:
    return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  except ModuleNotFoundError:  # no jax_plugins package at all
    return False


@pytest.mark.skipif(_has_cuda_plugin(), reason="this interpreter has the CUDA plugin")
def test_without_the_cuda_plugin_it_names_the_extra():
  result = subprocess.run(
      [sys.executable, "-m", "c2jax.cli", "plan", "--config=configs/pretrain.py:tiny",
       "--memory", "--target=h100-8"], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode != 0
  assert "--target=h100-8: XLA's GPU compiler (the CUDA plugin) is not installed" in (
      result.stderr)
  assert 'pip install -e ".[gpu-compile]"' in result.stderr


def _gpu_python() -> str:
  """$C2JAX_GPU_COMPILE_PYTHON, else the checkout's .venv-gpu (tools/setup.sh builds it)."""
  python = os.environ.get(ENV, "")
  if not python:
    default = REPO / ".venv-gpu" / "bin" / "python"
    if not default.is_file():
      pytest.skip(f"deviceless GPU compile: {HOW}.")
    python = str(default)
  if not pathlib.Path(python).is_file():
    pytest.fail(f"{ENV}={python} is not a file ({HOW}), or unset it to skip.")
  return python


@pytest.mark.slow
def test_plan_memory_target_h100_tiny():
  """The tiny train step for eight compile-only H100s: the JSON fields (no cost model on
  GPU: FLOPs and time are null), and per-device arguments that are the plan's parameter
  and optimizer shards (fsdp over 8) plus the batch shard."""
  python = _gpu_python()
  args = ["--config=configs/pretrain.py:tiny", "--memory", "--target=h100-8",
          "--config.train.batch_size=8", "--config.train.seq_len=64"]
  result = subprocess.run([python, "-m", "c2jax.cli", "plan", *args], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu"),
                          capture_output=True, text=True, timeout=900, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.loads(result.stdout.strip().splitlines()[-1])
  assert (out["target"], out["device_kind"], out["devices"]) == (
      "h100-8", "NVIDIA H100 80GB HBM3", 8)
  assert out["mesh"]["fsdp"] == 8 and out["fits"] is True
  assert out["flops"] is None and out["cost_model_seconds"] is None
  assert out["mfu_estimate"] is None
  assert out["collectives"]["all-gather"]["executions"] > 0  # fsdp gathers its params
  assert out["collectives"]["reduce-scatter"]["executions"] > 0  # and scatters its grads

  from configs import pretrain

  cfg = pretrain.get_config("tiny")
  summary = plan.summarize(plan.param_plans(cfg.model, cfg.parallel, 8))
  mem = out["memory"]
  assert mem["param_bytes"] == summary["param_bytes_per_device"]
  batch_shard = 5 * (8 // 8) * 64 * 4  # five int32/float32 [B, L] fields, B over fsdp
  exact = mem["param_bytes"] + mem["opt_state_bytes"] + batch_shard
  assert exact <= mem["argument_bytes"] <= 1.5 * exact
  assert "GPU compiler estimate" in result.stdout


@pytest.mark.slow
def test_mosaic_gpu_kernels_compile_to_device_code_for_h100_and_b200():
  """The grouped matmul and the MXFP8 block-scaled one (FP8 WGMMA), forward and both
  gradients, through Mosaic GPU for sm_90a (ptxas runs during the compile); a B200 never
  takes the Hopper kernel that ptxas rejects for sm_100a: tokamax's tcgen05 kernel runs
  its input gradient (bf16 out), while the float32-output forward (tokamax's Blackwell
  kernel writes 16-bit outputs only) and the weight gradient run the 'tiled' loop."""
  python = _gpu_python()
  result = subprocess.run(
      [python, "-m", "tools.compile.kernels", "--targets", "h100-8,b200-8", "--shapes",
       "tiny", "--kinds", "grouped,block_scaled"], cwd=REPO,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
      capture_output=True, text=True, timeout=900, check=False)
  assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
  rows = [json.loads(line[5:]) for line in result.stdout.splitlines()
          if line.startswith(("OK ", "FAIL"))]
  calls = {(row["target"], row["kind"]): row["mosaic_calls"] for row in rows}
  assert calls == {("h100-8", "grouped"): 3, ("h100-8", "block_scaled"): 3,
                   ("b200-8", "grouped"): 1, ("b200-8", "block_scaled"): 1}


@pytest.mark.slow
def test_tokamax_gpu_kernels_compile_for_h100_and_b200():
  """impl='tokamax': on sm_90a all three products are tokamax's Mosaic kernels; on sm_100a
  the forward and input gradient (tokamax has no Blackwell weight-gradient kernel: c2jax's
  'tiled' loop), with the shared-memory-fitting config library.py gives."""
  python = _gpu_python()
  result = subprocess.run(
      [python, "-m", "tools.compile.kernels", "--targets", "h100-8,b200-8", "--shapes",
       "tiny", "--kinds", "grouped:tokamax", "--out_dtype", "bfloat16"], cwd=REPO,
      env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=900, check=False)
  assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
  rows = [json.loads(line[5:]) for line in result.stdout.splitlines()
          if line.startswith(("OK ", "FAIL"))]
  assert {row["target"]: row["mosaic_calls"] for row in rows} == {"h100-8": 3, "b200-8": 2}


def test_tokamax_hopper_kernels_are_right_in_interpret_mode():
  """tokamax's sm_90 kernels in Mosaic GPU interpret mode (tools/compile/library_interpret):
  forward and input gradient match float64 on the rounded operands; the rows past the
  routed sum come back unwritten and c2jax zeroes them. Pallas' GPU interpreter cannot
  simulate the weight-gradient kernel (a shape error inside its WGMMA); where it can, that
  product must match too."""
  python = _gpu_python()
  result = subprocess.run([python, "-m", "tools.compile.library_interpret"], cwd=REPO,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                          text=True, timeout=900, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  for product in ("forward", "input_gradient"):
    assert report[product]["error"] < 1e-5, report
    assert report[product]["past_sum_unwritten"], report
    assert report[product]["past_sum_after_mask"] == 0, report
  weight = report["weight_gradient"]
  if "failed" in weight:
    assert "Expected shape" in weight["failed"], weight
  else:
    assert weight["error"] < 1e-5 and weight["empty_group_max"] == 0, weight


# Quantise then dequantise in one jitted function, compiled for one compile-only device of
# the target; prints whether the optimised HLO still holds the 256 x 256 FP8 values.
ROUND_TRIP = """
import re, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from c2jax.plan import topologies
from c2jax_kernels.block_scaled import formats
mesh = Mesh(np.array(topologies.parse_target(sys.argv[1]).devices()[:1]), ("x",))
x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16,
                         sharding=NamedSharding(mesh, PartitionSpec()))
round_trip = lambda x: formats.dequantize(formats.quantize(x, "mxfp8_e4m3", axis=-1))
hlo = jax.jit(round_trip).lower(x).compile().as_text()
shapes = re.findall(r"f8e4m3fn\\[([\\d,]+)\\]", hlo)  # e.g. [256,8,32]: values in blocks
kept = any(np.prod([int(d) for d in shape.split(",")]) == 256 * 256 for shape in shapes)
print("FP8 VALUES KEPT" if kept else "FP8 VALUES GONE")
"""


def _round_trip(python: str, target: str) -> str:
  # ALLOW_MULTIPLE_LIBTPU_LOAD: as `c2jax plan --target` sets it, so that libtpu loads while
  # another test process holds its single-user lock file.
  result = subprocess.run([python, "-c", ROUND_TRIP, target], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu",
                                   ALLOW_MULTIPLE_LIBTPU_LOAD="1"),
                          capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout.strip().splitlines()[-1]


def test_the_gpu_compiler_keeps_the_fp8_round_trip():
  """XLA's GPU compiler folds wide -> fp8 -> wide converts away when excess precision is
  allowed (its default): before formats.quantize put its values behind an optimisation
  barrier, MXFP8's portable 'dequantize' path computed in bf16 on an H200 (error against
  the unquantised product 1.7e-3 instead of MXFP8's 3.8e-2)."""
  assert _round_trip(_gpu_python(), "h100-8") == "FP8 VALUES KEPT"


def test_the_tpu_compiler_keeps_the_fp8_round_trip():
  """The same for the TPU compiler (libtpu, installed by tools/setup.sh), which
  runs MXFP8 through the 'dequantize' path."""
  pytest.importorskip("libtpu")
  assert _round_trip(sys.executable, "v5p-8") == "FP8 VALUES KEPT"
