"""What one RL actor's engine holds per chip, by weights_quant, for the large models.

    python -m tools.compile.actor_weights --models kimi_k25,deepseek_v3 \
        --actors 'v5p-32:expert=16;v5p-64:expert=8+tensor=4' --quant none,fp8,int4

For each model (configs/models.py) and actor mesh (a TPU slice and the actors.parallel
axes over its chips), the per-chip bytes of the engine's weights in `--dtype` with the
routed experts held as `actors.weights_quant` says, and of its KV cache of `--slots` x
`--max_length` (c2jax.plan.target.engine_state_bytes: each leaf's shard under the
engine's shardings on the slice's compile-only devices; arithmetic, no compile). Prints a
markdown table and whether weights + cache leave room on the chip (--hbm_gb, v5p's 95).
With --compile, each row's engine is also compiled for the slice (its prefill of up to 512
tokens and its decode over every slot, cache of --max_length): the compiler's peak memory
per chip and whether it fits (a program the compiler cannot fit in HBM is reported with
its temporaries, not raised); with --cost as well, a second compile with the layers
unrolled (XLA costs a loop body once) gives the compiler's time estimate of one decode
step and the tokens/s per chip it implies (estimates, not measured speed; each compile
takes minutes at this size on a small machine).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]


def parse_actor(text: str) -> tuple[str, dict[str, int]]:
  """'v5p-64:expert=16+tensor=2' -> ('v5p-64', {'expert': 16, 'tensor': 2})."""
  target, _, axes = text.partition(":")
  sizes = {}
  for part in filter(None, axes.split("+")):
    name, _, size = part.partition("=")
    sizes[name.strip()] = int(size)
  return target.strip(), sizes


def rows(models, actors, quants, *, dtype: str, slots: int, max_length: int,
         compile_steps: bool = False, cost: bool = False):
  from c2jax import config as configlib  # pylint: disable=g-import-not-at-top
  from c2jax.plan import target as target_lib  # pylint: disable=g-import-not-at-top
  from c2jax.plan import topologies  # pylint: disable=g-import-not-at-top

  for variant in models:
    cfg = configlib.load_config_file(str(REPO / "configs/rl.py"), "kimi_k25")
    cfg.model = configlib.load_config_file(str(REPO / "configs/models.py"), variant)
    cfg.model.param_dtype = cfg.model.dtype = dtype
    cfg.actors.slots, cfg.actors.max_length = slots, max_length
    for name, sizes in actors:
      target = topologies.parse_target(name)
      cfg.actors.parallel.mesh.update({**{axis: 1 for axis in cfg.actors.parallel.mesh},
                                       **sizes})
      placement = target_lib.actor_placement(cfg, target.devices())
      for quant in quants:
        held = target_lib.engine_state_bytes(cfg.model, placement, slots=slots,
                                             max_length=max_length, weights_quant=quant)
        experts = held["weight_groups"]["routed experts"]["bytes_per_device"]
        row = dict(model=variant, actor=name, chips=placement.mesh.size,
                   mesh={k: v for k, v in placement.mesh.shape.items() if v > 1},
                   weights_quant=quant, weights_gb=held["weights_bytes"] / 1e9,
                   experts_gb=experts / 1e9, cache_gb=held["cache_bytes"] / 1e9)
        if compile_steps:
          cfg.actors.weights_quant = quant
          try:
            steps = target_lib.compile_engine_steps(
                cfg, None, slots=slots, context=max_length - 512 - 1, prefill=512,
                decode_steps=1, costed=cost, placement=placement, max_length=max_length,
                weights_quant=quant)
          except Exception as e:  # pylint: disable=broad-except
            oom = _out_of_memory(e)
            if oom is None:
              raise
            yield dict(row, fits=False, peak_gb=None, decode_ms=None, out_of_memory=oom)
            continue
          reports = [target_lib.step_report(step, target, costed=cost) for step in steps]
          decode = reports[1]
          row.update(peak_gb=max(r["memory"]["total_gb"] for r in reports),
                     fits=all(r["fits"] for r in reports),
                     decode_ms=decode["cost_model_seconds"] and decode["cost_model_seconds"] * 1e3)
          if row["decode_ms"]:
            row["tokens_per_s_per_chip"] = slots / (row["decode_ms"] / 1e3) / row["chips"]
        yield row


def _out_of_memory(error: Exception) -> str | None:
  """The TPU compiler's 'ran out of memory' error, shortened (None for any other)."""
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text:
    return None
  found = re.search(r"temporaries \(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)\. "
                    r"HLO module: (\S+?)\.?(\s|$)", text)
  if found is None:
    return text.splitlines()[0][:200]
  return f"{found[3]} needs {found[1]} GB of temporaries, {found[2]} GB available"


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", default="kimi_k25,deepseek_v3")
  parser.add_argument("--actors", default="v5p-32:expert=16;v5p-64:expert=32;"
                      "v5p-128:expert=64",
                      help="';'-separated SLICE:AXIS=N[+AXIS=N...] actor meshes")
  parser.add_argument("--quant", default="none,fp8,int4")
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--slots", type=int, default=64)
  parser.add_argument("--max_length", type=int, default=16384)
  parser.add_argument("--hbm_gb", type=float, default=95.0)
  parser.add_argument("--compile", action="store_true",
                      help="also compile each engine: the compiler's memory and fits")
  parser.add_argument("--cost", action="store_true",
                      help="with --compile: the decode step's time estimate (one more "
                      "compile, layers unrolled)")
  args = parser.parse_args(argv)
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # as c2jax plan --target does
  actors = [parse_actor(a) for a in args.actors.split(";")]
  compiled = " compiled: peak per chip, fits, decode step |" if args.compile else ""
  print(f"| model | actor (chips, mesh) | routed experts | weights GB/chip (experts) | "
        f"KV cache GB/chip ({args.slots} x {args.max_length}) | room on {args.hbm_gb:g} GB |"
        + compiled)
  print("|---|---|---|---|---|---|" + ("---|" if args.compile else ""))
  for row in rows(args.models.split(","), actors, args.quant.split(","), dtype=args.dtype,
                  slots=args.slots, max_length=args.max_length, compile_steps=args.compile,
                  cost=args.cost):
    room = args.hbm_gb - row["weights_gb"] - row["cache_gb"]
    quant = args.dtype if row["weights_quant"] == "none" else row["weights_quant"]
    line = (f"| {row['model']} | {row['actor']} ({row['chips']}, {row['mesh']}) | {quant} | "
            f"{row['weights_gb']:.1f} ({row['experts_gb']:.1f}) | {row['cache_gb']:.1f} | "
            f"{f'{room:.1f} GB' if room > 0 else 'does not fit'} |")
    if args.compile and row["peak_gb"] is None:
      line += f" does not compile: {row['out_of_memory']} |"
    elif args.compile:
      speed = (f"{row['decode_ms']:.2f} ms, {row['tokens_per_s_per_chip']:,.0f} tokens/s/chip"
               if row.get("decode_ms") else "no estimate")
      line += f" {row['peak_gb']:.1f} GB, {'fits' if row['fits'] else 'does not fit'}, {speed} |"
    print(line, flush=True)


if __name__ == "__main__":
  main()
