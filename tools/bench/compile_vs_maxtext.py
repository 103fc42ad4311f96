"""c2jax's and MaxText's train steps compiled by the same TPU compiler for the same slice.

  MAXTEXT_PYTHON=/path/to/maxtext-venv/bin/python \
  PYTHONPATH=. python tools/bench/compile_vs_maxtext.py --target=v5p-8

Both compile deviceless, with libtpu, at c2jax's `small` dimensions (MaxText's
`deepseek3-tiny` with the overrides of docs/benchmarks.md, "Train step against MaxText"):
bf16 compute, fp32 parameters and Adam moments, global batch per_device_batch_size x chips
of 256 tokens, full rematerialisation, grouped matmuls through megablox, all devices on
fsdp, and the layers unrolled in both (MaxText scan_layers=false, c2jax scan_unroll = the
layers), because XLA's cost analysis counts a loop body once. c2jax's side is
`c2jax plan --memory --target`; MaxText's is its own `train_compile` (MaxText 0.2.5 in its
own virtualenv: pip install "maxtext[tpu]==0.2.5"), which prints the compiled step's cost
and memory analyses. Prints both, and c2jax / MaxText ratios: compiler estimates, not
measured speed. --maxtext_log reads a saved train_compile output instead of compiling.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]

# c2jax `small` as MaxText overrides (docs/benchmarks.md, "Train step against MaxText").
SMALL_OVERRIDES = (
    "model_name=deepseek3-tiny override_model_config=true base_emb_dim=512 "
    "base_num_query_heads=8 base_num_kv_heads=8 base_mlp_dim=1536 base_moe_mlp_dim=256 "
    "base_num_decoder_layers=8 first_num_dense_layers=1 vocab_size=16384 num_experts=16 "
    "num_experts_per_tok=2 shared_experts=1 routed_scaling_factor=1.0 q_lora_rank=192 "
    "kv_lora_rank=128 qk_nope_head_dim=32 qk_rope_head_dim=16 v_head_dim=32 "
    "rope_type=default").split()
LAYERS = 8


def maxtext_command(python: str, target: str, per_device_batch: int, seq_len: int) -> list:
  configs = subprocess.run(
      [python, "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
      capture_output=True, text=True, check=True).stdout.strip()
  return [python, "-m", "maxtext.trainers.pre_train.train_compile",
          f"{configs}/configs/base.yml", "run_name=compile_vs_c2jax",
          f"base_output_directory={os.path.join(tempfile.gettempdir(), 'maxtext_compile')}", f"compile_topology={target}",
          "compile_topology_num_slices=1", f"per_device_batch_size={per_device_batch}",
          f"max_target_length={seq_len}", "dataset_type=synthetic", "scan_layers=false",
          "remat_policy=full", "enable_checkpointing=false", *SMALL_OVERRIDES]


def parse_maxtext(log: str) -> dict:
  """The cost and memory analyses train_compile prints at its end."""
  cost = re.search(r"^Cost analysis: (\{.*\})$", log, re.M)
  mem = re.search(r"^Memory analysis: CompiledMemoryStats\((.*)\)$", log, re.M)
  if not cost or not mem:
    raise SystemExit("MaxText's train_compile printed no cost/memory analysis; its output "
                     "ends:\n" + log[-3000:])
  fields = dict(re.findall(r"(\w+)=(\d+)", mem.group(1)))
  analysis = ast.literal_eval(cost.group(1))
  analysis = analysis[0] if isinstance(analysis, list) else analysis
  return {"argument_bytes": int(fields["argument_size_in_bytes"]),
          "output_bytes": int(fields["output_size_in_bytes"]),
          "alias_bytes": int(fields["alias_size_in_bytes"]),
          "temp_bytes": int(fields["temp_size_in_bytes"]),
          "code_bytes": int(fields["generated_code_size_in_bytes"]),
          "flops": float(analysis["flops"]),
          "cost_model_seconds": float(analysis["optimal_seconds"])}


def c2jax_settings(global_batch: int, seq_len: int) -> list[str]:
  """c2jax's `small` as it is compiled beside MaxText: 'key=value' config overrides."""
  return [f"train.batch_size={global_batch}", f"train.seq_len={seq_len}",
          "model.dtype=bfloat16", "model.param_dtype=float32",
          "model.opt_state_dtype=float32", "model.remat=full", "model.moe_impl=pallas",
          f"model.scan_unroll={LAYERS}"]


def c2jax_plan(target: str, global_batch: int, seq_len: int) -> dict:
  args = ["--config=configs/pretrain.py:small", "--memory", f"--target={target}",
          *(f"--config.{setting}" for setting in c2jax_settings(global_batch, seq_len))]
  env = dict(os.environ, PYTHONPATH=str(REPO))
  result = subprocess.run([sys.executable, "-m", "c2jax.cli", "plan", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, check=False)
  if result.returncode:
    raise SystemExit(f"c2jax plan failed:\n{result.stderr[-3000:]}")
  print(result.stdout)
  out = json.loads(result.stdout.strip().splitlines()[-1])
  return {**{k: out["memory"][k] for k in ("argument_bytes", "output_bytes", "alias_bytes",
                                          "temp_bytes", "code_bytes")},
          "flops": out["flops"], "cost_model_seconds": out["cost_model_seconds"]}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--target", default="v5p-8")
  parser.add_argument("--per_device_batch", type=int, default=8)
  parser.add_argument("--seq_len", type=int, default=256)
  parser.add_argument("--maxtext_log", default=None,
                      help="a saved train_compile output to read instead of compiling")
  parser.add_argument("--save_maxtext_log", default=None,
                      help="write MaxText's train_compile output here (for --maxtext_log)")
  args = parser.parse_args(argv)
  sys.path.insert(0, str(REPO))
  from c2jax.plan import topologies  # pylint: disable=g-import-not-at-top

  chips = topologies.parse_target(args.target).num_devices
  if args.maxtext_log:
    log = pathlib.Path(args.maxtext_log).read_text()
  else:
    python = os.environ.get("MAXTEXT_PYTHON")
    if not python:
      raise SystemExit("set MAXTEXT_PYTHON to the python of a MaxText 0.2.5 virtualenv, "
                       "or pass --maxtext_log")
    command = maxtext_command(python, args.target, args.per_device_batch, args.seq_len)
    result = subprocess.run(command, capture_output=True, text=True, check=False,
                            env=dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1"))
    log = result.stdout + result.stderr
    if args.save_maxtext_log:
      pathlib.Path(args.save_maxtext_log).write_text(log)
  maxtext = parse_maxtext(log)
  c2jax = c2jax_plan(args.target, args.per_device_batch * chips, args.seq_len)
  rows = [("per device, TPU compiler estimates", "c2jax", "MaxText 0.2.5", "c2jax / MaxText")]
  for key, scale, unit in (("argument_bytes", 1e6, "MB"), ("output_bytes", 1e6, "MB"),
                           ("alias_bytes", 1e6, "MB"), ("temp_bytes", 1e6, "MB"),
                           ("code_bytes", 1e6, "MB"), ("flops", 1e9, "GFLOP"),
                           ("cost_model_seconds", 1e-3, "ms")):
    ratio = c2jax[key] / maxtext[key] if maxtext[key] else float("nan")
    rows.append((f"{key} ({unit})", f"{c2jax[key] / scale:,.3f}",
                 f"{maxtext[key] / scale:,.3f}", f"{ratio:.2f}"))
  widths = [max(len(r[i]) for r in rows) for i in range(4)]
  for row in rows:
    print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
  print(json.dumps({"target": args.target, "c2jax": c2jax, "maxtext": maxtext}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
