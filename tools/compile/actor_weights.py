"""What one RL actor's engine holds per chip, by weights_quant, for the large models.

    python -m tools.compile.actor_weights --models kimi_k25,deepseek_v3 \
        --actors 'v5p-32:expert=16;v5p-64:expert=8+tensor=4' --quant none,fp8,int4

For each model (configs/models.py) and actor mesh (a TPU slice and the actors.parallel
axes over its chips), the per-chip bytes of the engine's weights in `--dtype` with the
routed experts held as `actors.weights_quant` says, and of its KV cache of `--slots` x
`--max_length` (c2jax.plan.target.engine_state_bytes: each leaf's shard under the
engine's shardings on the slice's compile-only devices; arithmetic, no compile). Prints a
markdown table and whether weights + cache leave room on the chip (--hbm_gb, v5p's 95).
The programs' own temporaries are `c2jax plan --memory`'s (the compile takes a while at
this size).
"""

from __future__ import annotations

import argparse
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]


def parse_actor(text: str) -> tuple[str, dict[str, int]]:
  """'v5p-64:expert=16+tensor=2' -> ('v5p-64', {'expert': 16, 'tensor': 2})."""
  target, _, axes = text.partition(":")
  sizes = {}
  for part in filter(None, axes.split("+")):
    name, _, size = part.partition("=")
    sizes[name.strip()] = int(size)
  return target.strip(), sizes


def rows(models, actors, quants, *, dtype: str, slots: int, max_length: int):
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
        yield dict(model=variant, actor=name, chips=placement.mesh.size,
                   mesh={k: v for k, v in placement.mesh.shape.items() if v > 1},
                   weights_quant=quant, weights_gb=held["weights_bytes"] / 1e9,
                   experts_gb=experts / 1e9, cache_gb=held["cache_bytes"] / 1e9)


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
  args = parser.parse_args(argv)
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # as c2jax plan --target does
  actors = [parse_actor(a) for a in args.actors.split(";")]
  print(f"| model | actor (chips, mesh) | routed experts | weights GB/chip (experts) | "
        f"KV cache GB/chip ({args.slots} x {args.max_length}) | room on {args.hbm_gb:g} GB |")
  print("|---|---|---|---|---|---|")
  for row in rows(args.models.split(","), actors, args.quant.split(","), dtype=args.dtype,
                  slots=args.slots, max_length=args.max_length):
    room = args.hbm_gb - row["weights_gb"] - row["cache_gb"]
    quant = args.dtype if row["weights_quant"] == "none" else row["weights_quant"]
    print(f"| {row['model']} | {row['actor']} ({row['chips']}, {row['mesh']}) | {quant} | "
          f"{row['weights_gb']:.1f} ({row['experts_gb']:.1f}) | {row['cache_gb']:.1f} | "
          f"{f'{room:.1f} GB' if room > 0 else 'does not fit'} |", flush=True)


if __name__ == "__main__":
  main()
