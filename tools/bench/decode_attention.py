"""A one-token GQA attention step over a KV cache, three ways, side by side on this backend:
`dot` (two einsums, as training and prefill compute attention), `blocks` (two dots over
the cache as it lies, other kv heads masked out: c2jax/model/attention_forms.py
`gqa_blocks`, a CPU step below STREAM_MIN_CACHE from BLOCKS_MIN_ROWS rows) and `stream`
(multiply-and-sum over the cache as it lies: `gqa_step`, a CPU step from STREAM_MIN_CACHE).

    python -m tools.bench.decode_attention
    python -m tools.bench.decode_attention --shapes 8x4168x4x2x64 --calls 20
    python -m tools.bench.decode_attention --target=v5p-8 --dtype=bfloat16

With --target (a TPU slice or GPU name as `c2jax plan --target` spells it) nothing runs:
`dot` and `stream` compile for one compile-only device of that target, and the compiler's own time
estimate and bytes accessed are printed instead (estimates, not measured speed).

    python -m tools.bench.decode_attention --target=v5p-8 --mla_prefill=4096

--mla_prefill L compiles one DeepSeek-V3 MLA layer (bf16) taking an L-token chunk against
its latent cache, both ways the engine can (`attention_forms.prefill_expands`: the latent
up-projected per head, or absorbed), and prints the compiler's time, FLOPs and temporaries.

A shape is BxTxKxGxE: batch, cache slots, KV heads, query heads per KV head, head width.
The cache is [B, T, K, E], the engine's layout. Each form is one jitted call; they
alternate for --rounds rounds of --calls calls and the best round counts. The forms are
checked to agree before timing.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import attention, attention_forms

# qwen3_tiny and qwen3_small (decode_peers.py) at a 16-token prompt + 64 new + 8,
# and qwen3_small at 4,096 prompt tokens.
DEFAULT_SHAPES = ("1x88x2x2x16", "8x88x2x2x16", "32x88x2x2x16", "1x88x4x2x64", "8x88x4x2x64",
                  "32x88x4x2x64", "1x4168x4x2x64", "8x4168x4x2x64")


# The forms as the model has them (c2jax/model/attention_forms.py), float32 out; --target
# compiles FORMS, a CPU run times CPU_FORMS (gqa_blocks is a CPU step's form only).
FORMS = {"dot": lambda *a: attention_forms.gqa_dots(*a, jnp.float32),
         "stream": lambda *a: attention_forms.gqa_step(*a, jnp.float32)}
CPU_FORMS = {**FORMS, "blocks": lambda *a: attention_forms.gqa_blocks(*a, jnp.float32)}


def _inputs(shape: str, dtype=jnp.float32):
  """q [B, 1, K, G, E], the cache's keys and values [B, T, K, E], mask [B, 1, 1, T]."""
  b, t, k, g, e = map(int, shape.split("x"))
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((b, 1, k, g, e)), dtype)
  keys, values = (jnp.asarray(rng.standard_normal((b, t, k, e)), dtype) for _ in "kv")
  mask = jnp.asarray(np.arange(t)[None, :] < rng.integers(1, t + 1, (b, 1)))[:, None, None]
  return q, keys, values, mask


def compiled_estimates(shape: str, target_name: str, dtype) -> dict:
  """Each form compiled for one device of `target_name`: the compiler's time estimate (s)
  and bytes accessed."""
  from c2jax.plan import topologies  # pylint: disable=g-import-not-at-top
  device = topologies.parse_target(target_name).devices()[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  args = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
          for x in _inputs(shape, dtype)]
  row = {"shape": shape}
  for name, form in FORMS.items():
    cost = jax.jit(form).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    row[name] = (float(cost.get("optimal_seconds", 0.0)), float(cost.get("bytes accessed", 0)))
  return row


def mla_prefill_estimates(target_name: str, length: int) -> dict:
  """{'absorbed' | 'expanded': (seconds, flops, temporary bytes)} for one DeepSeek-V3 MLA
  layer's cached prefill of `length` tokens, compiled for one device of `target_name`."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from c2jax.model import variants  # pylint: disable=g-import-not-at-top
  from c2jax.plan import topologies  # pylint: disable=g-import-not-at-top
  cfg = variants.get("deepseek_v3", num_layers=1, first_k_dense=1, dtype="bfloat16",
                     param_dtype="bfloat16")
  mesh = jax.sharding.Mesh([topologies.parse_target(target_name).devices()[0]], ("x",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=replicated)
  module = attention.MLA(cfg)
  params = jax.eval_shape(lambda: nn.unbox(module.init(
      jax.random.key(0), jnp.zeros((1, 1, cfg.hidden_size)), jnp.zeros((1, 1), jnp.int32))))
  params = jax.tree.map(lambda a: spec(a.shape, a.dtype), params["params"])
  slots = length + 128
  cache = {"c_kv": spec((1, slots, cfg.kv_lora_rank), jnp.bfloat16),
           "k_rope": spec((1, slots, cfg.qk_rope_head_dim), jnp.bfloat16)}
  x = spec((1, length, cfg.hidden_size), jnp.bfloat16)
  positions = spec((1, length), jnp.int32)
  rule, out = attention_forms.prefill_expands, {}
  try:
    for name, expands in (("absorbed", False), ("expanded", True)):
      attention_forms.prefill_expands = lambda *_, e=expands: e
      with jax.set_mesh(mesh):
        compiled = jax.jit(lambda p, x, pos, c: module.apply({"params": p}, x, pos, None, c)
                           ).lower(params, x, positions, cache).compile()
      cost = compiled.cost_analysis()
      cost = cost[0] if isinstance(cost, list) else cost
      out[name] = (float(cost.get("optimal_seconds", 0.0)), float(cost.get("flops", 0.0)),
                   compiled.memory_analysis().temp_size_in_bytes)
  finally:
    attention_forms.prefill_expands = rule
  out["rule"] = "expanded" if rule(length, cfg.qk_nope_head_dim, cfg.v_head_dim,
                                   cfg.kv_lora_rank) else "absorbed"
  return out


def measure(shape: str, rounds: int, calls: int) -> dict:
  q, keys, values, mask = _inputs(shape)
  forms = {name: jax.jit(form) for name, form in CPU_FORMS.items()}
  outs = [f(q, keys, values, mask) for f in forms.values()]
  for out in outs[1:]:
    np.testing.assert_allclose(out, outs[0], rtol=1e-4, atol=1e-5)
  best = {name: float("inf") for name in forms}
  for _ in range(rounds):
    for name, f in forms.items():
      start = time.perf_counter()
      for _ in range(calls):
        out = f(q, keys, values, mask)
      out.block_until_ready()
      best[name] = min(best[name], (time.perf_counter() - start) / calls)
  return {"shape": shape, **{f"{name}_us": best[name] * 1e6 for name in forms},
          "dot / blocks": best["dot"] / best["blocks"],
          "dot / stream": best["dot"] / best["stream"]}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES))
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--calls", type=int, default=100)
  parser.add_argument("--target", default=None, help="compile for this TPU/GPU target")
  parser.add_argument("--dtype", default="float32", help="with --target: the cache's dtype")
  parser.add_argument("--mla_prefill", type=int, default=0,
                      help="with --target: a DeepSeek-V3 MLA prefill chunk of this many "
                           "tokens, expanded against absorbed")
  args = parser.parse_args(argv)
  if args.mla_prefill:
    if not args.target:
      parser.error("--mla_prefill needs --target")
    rows = mla_prefill_estimates(args.target, args.mla_prefill)
    print(f"DeepSeek-V3 MLA layer, {args.mla_prefill}-token prefill chunk, {args.target}, "
          f"bf16; compiler estimates (prefill_expands picks {rows.pop('rule')})")
    for name, (seconds, flops, temps) in rows.items():
      print(f"{name:>9}: {seconds * 1e3:8.2f} ms  {flops / 1e12:6.2f} TFLOP  "
            f"temporaries {temps / 1e9:6.2f} GB")
    return
  if args.target:
    print(f"one-token attention compiled for {args.target}, {args.dtype}; compiler "
          "estimates, not measured speed")
    print(f"{'BxTxKxGxE':>16} {'dot us':>10} {'stream us':>10} {'dot/stream':>10} "
          f"{'dot MB':>9} {'stream MB':>9}")
    for shape in args.shapes.split(","):
      row = compiled_estimates(shape, args.target, jnp.dtype(args.dtype))
      (dot_s, dot_b), (stream_s, stream_b) = row["dot"], row["stream"]
      ratio = dot_s / stream_s if stream_s else float("nan")
      print(f"{shape:>16} {dot_s * 1e6:10.1f} {stream_s * 1e6:10.1f} {ratio:10.2f} "
            f"{dot_b / 1e6:9.2f} {stream_b / 1e6:9.2f}", flush=True)
    return
  print(f"one-token attention, {jax.default_backend()}, jax {jax.__version__}")
  print(f"{'BxTxKxGxE':>16} {'dot us':>10} {'blocks us':>10} {'stream us':>10} "
        f"{'dot/blocks':>10} {'dot/stream':>10}")
  for shape in args.shapes.split(","):
    row = measure(shape, args.rounds, args.calls)
    print(f"{row['shape']:>16} {row['dot_us']:10.1f} {row['blocks_us']:10.1f} "
          f"{row['stream_us']:10.1f} {row['dot / blocks']:10.2f} {row['dot / stream']:10.2f}",
          flush=True)


if __name__ == "__main__":
  main()
