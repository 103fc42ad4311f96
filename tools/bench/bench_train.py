"""Train-step throughput: tokens/s and model FLOPs utilisation against a measured ceiling.

  PYTHONPATH=. python tools/bench/bench_train.py --variants tiny,small --steps 10

The ceiling is the best rate of one large jitted float32 (bfloat16 on accelerators) matmul
on the same device (c2jax.parallel.accelerators.matmul_ceiling); model FLOPs per token
are c2jax.parallel.roofline.train_flops_per_token (3 forward passes of the active matmul
weights plus causal attention). Prints one table, all rows measured in the same run.
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
from c2jax.model import variants
from c2jax.parallel import accelerators, roofline


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
              model_tflops=tokens_per_s * roofline.train_flops_per_token(cfg, seq_len) / 1e12)


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
  ceiling = accelerators.matmul_ceiling(dtype)
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
