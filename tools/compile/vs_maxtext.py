"""c2jax's and MaxText's train steps compiled by the same TPU compiler for the same slice.

  MAXTEXT_PYTHON=/path/to/maxtext-venv/bin/python \
  python -m tools.compile.vs_maxtext --target=v5p-8

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

--model=deepseek_v3 compiles DeepSeek-V3 671B's dimensions instead (MaxText's
`deepseek3-671b`, c2jax's `configs/pretrain.py:deepseek_v3`) with --layers decoder layers
(3 dense, then MoE) and its MTP layer, unrolled on both sides, on c2jax's real-scale mesh
(the config's expert and context axes, contiguous context shards as MTP needs, fsdp the
rest), --per_device_batch sequences of --seq_len tokens per chip, the config's
group-limited routing, expert parallelism with bf16 dispatch. MaxText's megablox path is dropless (its capacity_factor
applies only to its dense einsum path); c2jax runs its config's capacity factor 1.25, or
dropless with --c2jax_extra=model.moe.ep_capacity_factor=0. At 4,096 tokens c2jax attends
in blockwise tiles, a loop the cost analysis counts once; --c2jax_cost_attention=dense
costs every query-key pair instead (an upper bound; MaxText runs its splash kernel):

  MAXTEXT_PYTHON=... python -m tools.compile.vs_maxtext \
      --model=deepseek_v3 --target=v5p-512 --layers=4 --per_device_batch=1 --seq_len=4096
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


def deepseek_v3_config():
  """c2jax's real-scale DeepSeek-V3 job (configs/pretrain.py:deepseek_v3)."""
  from c2jax import config as configlib  # pylint: disable=g-import-not-at-top
  return configlib.load_config_file(REPO / "configs" / "pretrain.py", "deepseek_v3")


def deepseek_v3_overrides(layers: int, chips: int) -> list[str]:
  """MaxText's `deepseek3-671b` with `layers` decoder layers, laid out as c2jax's
  real-scale job is: its mesh, MTP layers, routing groups and context sharding."""
  cfg = deepseek_v3_config()
  expert, context = cfg.parallel.mesh.expert, cfg.parallel.mesh.context
  if chips % (expert * context):
    raise SystemExit(f"--model=deepseek_v3 needs a multiple of {expert * context} chips "
                     f"(expert {expert} x context {context}); the target has {chips}")
  moe = cfg.model.moe
  return ["model_name=deepseek3-671b", "override_model_config=true",
          f"base_num_decoder_layers={layers}", f"mtp_num_layers={cfg.model.num_mtp_layers}",
          f"n_routing_groups={moe.n_group}", f"topk_routing_group={moe.topk_group}",
          f"ici_fsdp_parallelism={chips // (expert * context)}",
          f"ici_expert_parallelism={expert}", f"ici_context_parallelism={context}",
          f"context_parallel_load_balance={str(cfg.parallel.context_load_balance).lower()}",
          "allow_split_physical_axes=true"]


def maxtext_command(python: str, target: str, per_device_batch: float | str, seq_len: int,
                    model: str = "small", layers: int = LAYERS, chips: int = 0,
                    extra: tuple = ()) -> list:
  configs = subprocess.run(
      [python, "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
      capture_output=True, text=True, check=True).stdout.strip()
  overrides = (SMALL_OVERRIDES if model == "small"
               else deepseek_v3_overrides(layers, chips))
  return [python, "-m", "maxtext.trainers.pre_train.train_compile",
          f"{configs}/configs/base.yml", "run_name=compile_vs_c2jax",
          f"base_output_directory={os.path.join(tempfile.gettempdir(), 'maxtext_compile')}", f"compile_topology={target}",
          "compile_topology_num_slices=1", f"per_device_batch_size={per_device_batch}",
          f"max_target_length={seq_len}", "dataset_type=synthetic", "scan_layers=false",
          "remat_policy=full", "enable_checkpointing=false", *overrides, *extra]


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


def c2jax_settings(global_batch: int, seq_len: int, model: str = "small",
                   layers: int = LAYERS) -> list[str]:
  """c2jax's step as it is compiled beside MaxText: 'key=value' config overrides."""
  if model == "small":
    return [f"train.batch_size={global_batch}", f"train.seq_len={seq_len}",
            "model.dtype=bfloat16", "model.param_dtype=float32",
            "model.opt_state_dtype=float32", "model.remat=full", "model.moe_impl=pallas",
            f"model.scan_unroll={LAYERS}"]
  # configs/pretrain.py:deepseek_v3 already has bf16 compute, float32 masters and
  # moments, full remat, megablox and the mesh; only MXFP8 dispatch is turned off,
  # as MaxText dispatches in the compute dtype.
  return [f"train.batch_size={global_batch}", f"train.seq_len={seq_len}",
          f"model.num_layers={layers}", f"model.scan_unroll={layers}",
          "model.moe.ep_dispatch_quant=none"]


def c2jax_plan(target: str, global_batch: int, seq_len: int, model: str = "small",
               layers: int = LAYERS, extra: tuple = (),
               cost_attention: str = "as_configured") -> dict:
  config = "small" if model == "small" else "deepseek_v3"
  args = [f"--config=configs/pretrain.py:{config}", "--memory", f"--target={target}",
          f"--target_cost_attention={cost_attention}",
          *(f"--config.{setting}"
            for setting in (*c2jax_settings(global_batch, seq_len, model, layers), *extra))]
  env = dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1")
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
  parser.add_argument("--model", choices=("small", "deepseek_v3"), default="small")
  parser.add_argument("--layers", type=int, default=None,
                      help="decoder layers (--model=deepseek_v3; default 4: 3 dense, 1 MoE)")
  parser.add_argument("--maxtext_extra", default="",
                      help="more MaxText overrides, space-separated (e.g. num_vocab_tiling=16)")
  parser.add_argument("--c2jax_extra", default="",
                      help="more c2jax config overrides, space-separated key=value")
  parser.add_argument("--c2jax_cost_attention", choices=("as_configured", "dense"),
                      default="as_configured",
                      help="c2jax plan --target_cost_attention: blockwise attention's "
                           "tiles costed once (as_configured, a lower bound) or every "
                           "query-key pair (dense, an upper bound)")
  parser.add_argument("--target", default="v5p-8")
  parser.add_argument("--per_device_batch", type=float, default=8,
                      help="sequences per chip; a fraction when a sequence spans chips "
                           "(e.g. 0.5 on v5p-1024 for DeepSeek-V3's 256 sequences)")
  parser.add_argument("--seq_len", type=int, default=256)
  parser.add_argument("--maxtext_log", default=None,
                      help="a saved train_compile output to read instead of compiling")
  parser.add_argument("--save_maxtext_log", default=None,
                      help="write MaxText's train_compile output here (for --maxtext_log)")
  args = parser.parse_args(argv)
  from c2jax.plan import topologies  # pylint: disable=g-import-not-at-top

  chips = topologies.parse_target(args.target).num_devices
  global_batch = args.per_device_batch * chips
  if global_batch != int(global_batch) or global_batch < 1:
    raise SystemExit(f"--per_device_batch={args.per_device_batch} x {chips} chips is not a "
                     "whole number of sequences")
  per_device = f"{args.per_device_batch:g}"
  layers = args.layers or (LAYERS if args.model == "small" else 4)
  if args.model == "small" and layers != LAYERS:
    raise SystemExit(f"--layers applies to --model=deepseek_v3; small has {LAYERS}")
  if args.maxtext_log:
    log = pathlib.Path(args.maxtext_log).read_text()
  else:
    python = os.environ.get("MAXTEXT_PYTHON")
    if not python:
      raise SystemExit("set MAXTEXT_PYTHON to the python of a MaxText 0.2.5 virtualenv, "
                       "or pass --maxtext_log")
    command = maxtext_command(python, args.target, per_device, args.seq_len,
                              args.model, layers, chips, tuple(args.maxtext_extra.split()))
    result = subprocess.run(command, capture_output=True, text=True, check=False,
                            env=dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1"))
    log = result.stdout + result.stderr
    if args.save_maxtext_log:
      pathlib.Path(args.save_maxtext_log).write_text(log)
  maxtext = parse_maxtext(log)
  c2jax = c2jax_plan(args.target, int(global_batch), args.seq_len, args.model,
                     layers, tuple(args.c2jax_extra.split()), args.c2jax_cost_attention)
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
  print(json.dumps({"target": args.target, "model": args.model, "layers": layers,
                    "c2jax_cost_attention": args.c2jax_cost_attention,
                    "c2jax": c2jax, "maxtext": maxtext}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
