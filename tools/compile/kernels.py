"""Compile c2jax's Pallas kernels through Mosaic (not the interpreter) for TPU slices, and
through Mosaic GPU for compile-only NVIDIA GPUs.

  python -m tools.compile.kernels --targets v5p-8,v6e-8 \
      --shapes small,deepseek_v3,kimi_k25
  JAX_PLATFORMS=cpu .venv-gpu/bin/python -m tools.compile.kernels \
      --targets h100-8,b200-8 --shapes small,deepseek_v3,kimi_k25    # the gpu-compile venv

For each target and MoE shape it compiles, with libtpu's compiler and compile-only devices
(c2jax/plan/topologies.py; pip install -e ".[tpu-compile]"), the grouped matmul's forward
(megablox gmm), its input gradient (gmm against the transposed weights) and its weight
gradient (tgmm): c2jax_kernels.grouped_matmul with impl=None under a mesh of the target's
devices, which picks 'megablox' and Mosaic for the TPU, plus the block-scaled (MXFP8
recipe) grouped matmul, whose TPU path runs the same kernels on dequantised operands.
For a GPU target (h100-8, b200-8: XLA's GPU compiler, the gpu-compile extra) the same
calls pick 'mosaic_gpu' (the grouped matmul written for Hopper's warpgroup MMA, lowered
to sm_90a / sm_100a device code); the GPU compiler gives no cost estimate.
Each compile runs in its own process (a compiler abort fails one row only); it prints
one line per compile (OK with the compiler's memory and time estimate, or the error) and a JSON summary last; the exit status is 1 when any compile failed.
Shapes are one expert layer's per-device work: M = tokens x top-k routed rows.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import c2jax_kernels as kernels
from c2jax_kernels import weight_quant
from c2jax_kernels.weight_quant import grouped as weight_quant_grouped
from c2jax.plan import target as target_lib
from c2jax.plan import topologies

REPO = pathlib.Path(__file__).resolve().parents[2]

# name -> (M routed rows, K hidden, N expert width, G experts on the device)
SHAPES = {
    "tiny": (256, 64, 128, 4),
    # An engine's decode step: 64 slots x top-8 routed rows over Kimi-K2.5's experts / EP 8.
    "kimi_k25_decode": (64 * 8, 7168, 2048, 48),
    "small": (8192 * 2 // 4, 512, 256, 16),       # batch 32 x 256 tokens, top-2, 4 chips
    "deepseek_v3": (4096 * 8, 7168, 2048, 32),    # 4k tokens x top-8; 256 experts / EP 8
    "kimi_k25": (4096 * 8, 7168, 2048, 48),       # 384 experts / EP 8
}


def _loss(kind, dtype, out_dtype=jnp.float32):
  kind, _, impl = kind.partition(":")  # 'grouped:tiled' names an impl; else the default
  def grouped(lhs, rhs, sizes):
    if kind == "block_scaled":
      out = kernels.block_scaled_grouped_matmul(lhs, rhs, sizes, recipe="mxfp8",
                                                impl=impl or None,
                                                preferred_element_type=out_dtype)
    else:
      out = kernels.grouped_matmul(lhs, rhs, sizes, impl=impl or None,
                                   preferred_element_type=out_dtype)
    return jnp.sum(out.astype(jnp.float32))
  # The loss value keeps the forward kernel alive beside both gradient kernels.
  return jax.value_and_grad(grouped, argnums=(0, 1))


def _resident(kind: str, out_dtype):
  """'weight_quant:SCHEME[:IMPL]': an engine's forward against resident quantised experts
  (kernels/weight_quant; no gradients). 'slabs' runs with its K loop unrolled, since the
  TPU compiler's cost model counts a loop's body once."""
  impl = (kind.split(":") + [""])[2]  # the scheme is the weight's

  def forward(lhs, w, sizes):
    if impl == "slabs":
      return weight_quant_grouped.slabs_gmm(lhs, w, sizes, out_dtype=out_dtype, unroll=True)
    return weight_quant.quantized_grouped_matmul(
        lhs, w, sizes, impl=impl or None, preferred_element_type=out_dtype)
  return forward


def compile_one(devices, kind: str, shape: tuple[int, int, int, int], dtype,
                out_dtype=jnp.float32) -> dict:
  """Compiles the forward and both backward matmuls (for 'weight_quant:...', the forward)
  on one device of `devices` under their mesh; returns the compiler's figures or raises."""
  m, k, n, g = shape
  mesh = jax.sharding.Mesh(np.asarray(devices[:1]), ("x",))
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  resident = kind.startswith("weight_quant:")
  rhs = (weight_quant.abstract_quantized((g, k, n), kind.split(":")[1], sharding=rep,
                                          scale_sharding=rep)
         if resident else jax.ShapeDtypeStruct((g, k, n), dtype, sharding=rep))
  args = (jax.ShapeDtypeStruct((m, k), dtype, sharding=rep), rhs,
          jax.ShapeDtypeStruct((g,), jnp.int32, sharding=rep))
  fn = _resident(kind, out_dtype) if resident else _loss(kind, dtype, out_dtype)
  begun = time.perf_counter()
  with jax.set_mesh(mesh):
    if kernels.target_platform() not in ("tpu", "gpu", "cuda"):
      raise RuntimeError("the mesh's devices are not TPU or GPU devices")
    compiled = jax.jit(fn).lower(*args).compile()
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, list) and cost else cost) or {}
  mem = compiled.memory_analysis()
  return {"compile_s": round(time.perf_counter() - begun, 1),
          "mosaic_calls": target_lib.mosaic_calls(compiled.as_text()),
          "temp_bytes": int(mem.temp_size_in_bytes),
          "cost_model_s": cost.get("optimal_seconds")}


def _compile_in_child(target_name: str, shape_name: str, dtype_name: str, kind: str,
                      out_dtype: str) -> dict:
  """One compile in its own process: a compiler that aborts (a failed CHECK in libtpu)
  takes only that row down; its last fatal line is the row's error."""
  command = [sys.executable, "-m", "tools.compile.kernels", "--one", target_name, shape_name,
             dtype_name, kind, "--out_dtype", out_dtype]
  result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
  for line in reversed(result.stdout.splitlines()):
    if line.startswith("{"):
      return json.loads(line)
  fatal = [line for line in result.stderr.splitlines() if line.startswith(("F", "Check"))]
  return {"ok": False, "error": f"compiler exited {result.returncode}: "
          + (fatal[-1] if fatal else result.stderr[-400:])}


def _one(target_name: str, shape_name: str, dtype_name: str, kind: str, out_dtype: str) -> None:
  devices = topologies.parse_target(target_name).devices()
  try:
    row = {"ok": True, **compile_one(devices, kind, SHAPES[shape_name],
                                     jnp.dtype(dtype_name), jnp.dtype(out_dtype))}
  except Exception as err:  # Mosaic's or the compiler's message, reported as the row
    row = {"ok": False, "error": f"{type(err).__name__}: {str(err)[:400]}"}
  print(json.dumps(row), flush=True)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--targets", default="v5p-8,v6e-8")
  parser.add_argument("--shapes", default="small,deepseek_v3,kimi_k25")
  # FP8 is not offered: TPU v5p and v6e have no FP8 matmul unit, and the megablox kernels
  # accept bfloat16 and float32 operands only (docs/scaling.md).
  parser.add_argument("--dtypes", default="bfloat16")
  # grouped | block_scaled, each with the platform's default impl, or e.g. grouped:tiled
  # for one of c2jax_kernels.grouped_matmul_impls(); weight_quant:int4[:slabs|tokamax]
  # (int8, fp8): an engine's forward against resident quantised experts.
  parser.add_argument("--kinds", default="grouped,block_scaled")
  # The matmuls' output dtype (accumulation is float32 either way); the MoE layer writes
  # the model dtype, bfloat16.
  parser.add_argument("--out_dtype", default="float32")
  parser.add_argument("--one", nargs=4, default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # see commands/plan_target.py
  jax.config.update("jax_platforms", "cpu")
  if args.one:
    _one(*args.one, args.out_dtype)
    return 0
  results = []
  for target_name in args.targets.split(","):
    for shape_name in args.shapes.split(","):
      for dtype_name in args.dtypes.split(","):
        for kind in args.kinds.split(","):
          row = {"target": target_name, "shape": shape_name, "dtype": dtype_name,
                 "kind": kind, "mkng": SHAPES[shape_name],
                 "out_dtype": args.out_dtype,
                 **_compile_in_child(target_name, shape_name, dtype_name, kind,
                                     args.out_dtype)}
          results.append(row)
          print(("OK  " if row["ok"] else "FAIL") + " " + json.dumps(row), flush=True)
  failed = sum(not row["ok"] for row in results)
  print(json.dumps({"compiled": len(results) - failed, "failed": failed}))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
