"""Train-step throughput: tokens/s and model FLOPs utilisation against a measured ceiling.

  PYTHONPATH=. python tools/bench/bench_train.py --variants tiny,small --steps 10

The ceiling is the best rate of one large jitted float32 (bfloat16 on accelerators) matmul
on the same device; model FLOPs per token are 6 x active non-embedding parameters (forward
+ backward) plus the attention score/value matmuls, 6 x layers x heads x
(qk_head_dim + v_head_dim) x seq_len / 2 (causal). Prints one table, all rows measured in
the same run.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2jax import train
from c2jax.model import counting, variants


def matmul_ceiling(dtype, n: int = 2048, repeats: int = 5) -> float:
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x, y: x @ y)
  f(a, a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    f(a, a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * n**3 / best


def flops_per_token(cfg, seq_len: int) -> float:
  counts = counting.count_params(cfg)
  embedding = 2 * cfg.vocab_size * cfg.hidden_size  # lookup is free; the head is not
  dense_params = counts["active_params"] - embedding + cfg.vocab_size * cfg.hidden_size
  if cfg.attention == "mla":
    head_dims = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim
  else:
    head_dims = 2 * cfg.head_dim
  attention = 6 * cfg.num_layers * cfg.num_heads * head_dims * seq_len / 2
  return 6 * dense_params + attention


def bench_variant(name: str, batch: int, seq_len: int, steps: int, moe_impl: str):
  cfg = variants.get(name, moe_impl=moe_impl)
  optimizer, _ = train.make_optimizer(learning_rate=1e-3, total_steps=1000)
  state = train.create_train_state(cfg, optimizer, jax.random.key(0))
  step = jax.jit(functools.partial(train.train_step, cfg, optimizer), donate_argnums=0)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.vocab_size, size=(batch, seq_len + 1))
  batch_arrays = {
      "inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
      "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
      "positions": jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32), (batch, seq_len)),
      "segment_ids": jnp.ones((batch, seq_len), jnp.int32),
      "loss_mask": jnp.ones((batch, seq_len), jnp.float32)}
  compile_start = time.perf_counter()
  state, metrics = step(state, batch_arrays)
  jax.block_until_ready(metrics)
  compile_s = time.perf_counter() - compile_start
  start = time.perf_counter()
  for _ in range(steps):
    state, metrics = step(state, batch_arrays)
  jax.block_until_ready(metrics)
  seconds = (time.perf_counter() - start) / steps
  tokens_per_s = batch * seq_len / seconds
  return dict(variant=name, moe_impl=moe_impl, batch=batch, seq_len=seq_len,
              step_ms=seconds * 1e3, tokens_per_s=tokens_per_s, compile_s=compile_s,
              model_tflops=tokens_per_s * flops_per_token(cfg, seq_len) / 1e12)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variants", default="tiny,small")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq_len", type=int, default=256)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--moe_impls", default="dense,ragged")
  args = parser.parse_args()
  device = jax.devices()[0]
  dtype = jnp.float32 if device.platform == "cpu" else jnp.bfloat16
  ceiling = matmul_ceiling(dtype)
  print(f"train step throughput, {datetime.date.today()}, {device.platform} "
        f"({device.device_kind}), {jax.device_count()} device(s), jax {jax.__version__}")
  print(f"ceiling: {jnp.dtype(dtype).name} 2048^3 matmul = {ceiling / 1e12:.3f} TFLOP/s\n")
  header = (f"{'variant':<8} {'moe_impl':<8} {'batch x len':>11} {'step ms':>9} "
            f"{'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'compile s':>9}")
  print(header)
  print("-" * len(header))
  for name in args.variants.split(","):
    for impl in args.moe_impls.split(","):
      r = bench_variant(name, args.batch, args.seq_len, args.steps, impl)
      print(f"{r['variant']:<8} {r['moe_impl']:<8} {f'{args.batch}x{args.seq_len}':>11} "
            f"{r['step_ms']:>9.1f} {r['tokens_per_s']:>10,.0f} {r['model_tflops']:>8.4f} "
            f"{r['model_tflops'] * 1e12 / ceiling:>6.1%} {r['compile_s']:>9.1f}", flush=True)


if __name__ == "__main__":
  main()
