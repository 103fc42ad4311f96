"""One expert-parallel MoE layer, forward and backward, through the TPU compiler, for each
token exchange: fixed buckets (dropless or with a capacity) and ragged.

  python -m tools.compile.ep_exchange --target=v5p-16 \
      --exchanges=ragged:0,fixed:0,fixed:1.25        # DeepSeek-V3's expert layer
  python -m tools.compile.ep_exchange --shape=tiny --target=v5p-8

The layer is `c2jax.parallel.expert.moe_forward` with the Pallas grouped matmuls (megablox
on TPU), bf16 tokens and weights, one --seq_len sequence per chip, the mesh fsdp x expert
--expert (the weights split over both, gathered inside as the model does). Only shapes
are compiled (no routing values exist), so the dropless rows are priced at their static
worst-case buffers. Each row: the compiler's time estimate, FLOPs and bytes accessed, the
temporaries, and the collectives' operand bytes per chip (hlo_comms; a ragged exchange's
count is an upper bound, its send buffer). All of it is the TPU compiler's estimate,
not measured speed; the cost model prices a collective by the bytes it touches in HBM,
not by the interconnect. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from c2jax import parallel
from c2jax.model import moe_dispatch
from c2jax.parallel import expert
from c2jax.plan import hlo_comms, topologies

# (experts, top-k, hidden, expert width)
SHAPES = {"deepseek_v3": (256, 8, 7168, 2048), "kimi_k25": (384, 8, 7168, 2048),
          "tiny": (16, 2, 256, 128)}


def compile_layer(mesh, rules, shape, seq_len, exchange, capacity_factor,
                  dispatch_quant="none"):
  num_experts, top_k, hidden, width = shape
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    plan = expert.plan_from_context()
    forward = functools.partial(
        expert.moe_forward, plan=plan, local_dispatch=moe_dispatch.DISPATCH["pallas"],
        capacity_factor=capacity_factor, dispatch_quant=dispatch_quant,
        logical_axes=moe_dispatch.EXPERT_AXES,
        exchange=exchange, local_grouped=functools.partial(
            moe_dispatch.grouped_experts, impl=moe_dispatch.grouped_impl("pallas")))

    def loss(x, weights, indices, experts):
      return jnp.sum(forward(x, weights, indices, experts)[0].astype(jnp.float32))

    tokens = seq_len * mesh.size
    on_tokens = NamedSharding(mesh, P(plan.token_axes))
    on_experts = NamedSharding(mesh, P("expert", "fsdp"))
    spec = jax.ShapeDtypeStruct
    args = (spec((tokens, hidden), jnp.bfloat16, sharding=on_tokens),
            spec((tokens, top_k), jnp.float32, sharding=on_tokens),
            spec((tokens, top_k), jnp.int32, sharding=on_tokens),
            moe_dispatch.ExpertWeights(*(
                spec(s, jnp.bfloat16, sharding=on_experts) for s in
                ((num_experts, hidden, width), (num_experts, hidden, width),
                 (num_experts, width, hidden)))))
    start = time.time()
    compiled = jax.jit(jax.grad(loss, argnums=(0, 3))).lower(*args).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  volumes = hlo_comms.comm_volume(compiled.as_text())
  return {"exchange": exchange, "capacity_factor": capacity_factor,
          "compile_seconds": round(time.time() - start, 1),
          "cost_model_seconds": float(cost.get("optimal_seconds", 0.0)),
          "flops": float(cost.get("flops", 0.0)),
          "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
          "temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
          "collective_operand_bytes": {kind: v.operand_bytes for kind, v in volumes.items()
                                       if v.operand_bytes}}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--target", default="v5p-16")
  parser.add_argument("--shape", choices=sorted(SHAPES), default="deepseek_v3")
  parser.add_argument("--expert", type=int, default=8, help="EP shards (mesh 'expert')")
  parser.add_argument("--seq_len", type=int, default=4096, help="tokens per chip")
  parser.add_argument("--exchanges", default="ragged:0,fixed:0,fixed:1.25",
                      help="comma-separated EXCHANGE:CAPACITY_FACTOR")
  parser.add_argument("--dispatch_quant", choices=sorted(expert.DISPATCH_FORMATS),
                      default="none", help="tokens' wire format (config.moe.ep_dispatch_quant)")
  args = parser.parse_args(argv)
  devices = topologies.parse_target(args.target).devices()
  if len(devices) % args.expert:
    raise SystemExit(f"--expert={args.expert} must divide the {len(devices)} chips of "
                     f"{args.target}")
  par = parallel.default_parallel_config()
  par.mesh.update({"data": 1, "fsdp": len(devices) // args.expert, "expert": args.expert,
                   "context": 1, "tensor": 1})
  mesh, rules = parallel.make_mesh(par.mesh, devices), parallel.rules_of(par)
  rows = []
  print(f"{args.shape} MoE layer, forward + backward, {args.target} ({len(devices)} chips, "
        f"expert {args.expert}), {args.seq_len} tokens a chip; TPU compiler estimates")
  print(f"{'exchange':<14} {'time ms':>9} {'TFLOP':>8} {'GB accessed':>12} "
        f"{'temp GB':>8}  collectives (operand GB)")
  for item in args.exchanges.split(","):
    name, factor = item.split(":")
    row = compile_layer(mesh, rules, SHAPES[args.shape], args.seq_len, name, float(factor),
                        args.dispatch_quant)
    rows.append(row)
    comms = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in row["collective_operand_bytes"].items())
    print(f"{item:<14} {row['cost_model_seconds'] * 1e3:>9.1f} {row['flops'] / 1e12:>8.2f} "
          f"{row['bytes_accessed'] / 1e9:>12.1f} {row['temp_bytes'] / 1e9:>8.2f}  {comms}",
          flush=True)
  print(json.dumps({"target": args.target, "shape": args.shape, "expert": args.expert,
                    "seq_len": args.seq_len, "dispatch_quant": args.dispatch_quant,
                    "rows": rows}))


if __name__ == "__main__":
  main()
