"""Train-step throughput: tokens/s and model FLOPs utilisation against a measured ceiling
and against the roofline.

  python -m tools.bench.train --variants tiny,small --steps 10
  python -m tools.bench.train --variants moe_8b_a1b --batch 4 \
      --seq_len 2048 --moe_impls ragged,pallas --attention_impl auto      # one GPU
  python -m tools.bench.train --smoke                  # seconds, CPU

The ceiling is the best rate of one large jitted float32 (bfloat16 on accelerators) matmul
on the same device (c2jax.plan.accelerators.matmul_ceiling); model FLOPs per token
are c2jax.plan.roofline.train_flops_per_token (3 forward passes of the active matmul
weights plus causal attention). MFU is given twice: over the measured matmul ceiling, and
over the device's datasheet bf16 peak (c2jax.plan.accelerators.ACCELERATORS, matched
by device kind; this machine's measured peaks where it is not in the table). 'bound ms'
is the roofline's lower bound for the step (roofline.train_step_cost's formula: compute
at peak vs the parameter/gradient/Adam bytes over HBM bandwidth), and 'of bound' the
bound over the measured step (1.0 = at the roofline). Prints one table, all rows measured
in the same run. Rows are interleaved: each of --steps rounds times one step of every
row and one ceiling matmul, and the table gives each row's best step over the best
ceiling, so on a shared machine whose load drifts, all are taken under the same
conditions; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

import ml_collections

from c2jax import host_memory, train
from c2jax.model import variants
from c2jax.plan import accelerators, roofline

SMOKE = dict(variants="tiny", batch=2, seq_len=32, steps=1, moe_impls="ragged")


def accelerator_of(device, ceiling_flops: float, copy_bytes: int) -> accelerators.Accelerator:
  """The datasheet row of this device's kind (e.g. 'NVIDIA H100 80GB HBM3' -> H100 SXM),
  else this device as measured: the matmul ceiling and a copy of `copy_bytes`."""
  return accelerators.by_device_kind(device.device_kind) or accelerators.Accelerator(
      f"this {device.platform} (measured)", ceiling_flops / 1e12, None,
      accelerators.copy_bandwidth(copy_bytes) / 1e12, 0.0, float("inf"))


def step_bound(cfg, batch: int, seq_len: int, acc) -> roofline.Bound:
  """The roofline bound of one step of `cfg` on one device of kind `acc` (formula only)."""
  job = ml_collections.ConfigDict({"model": cfg, "train": {"batch_size": batch,
                                                            "seq_len": seq_len}})
  return roofline.bound(roofline.train_step_cost(job, devices=1), acc)


class Row:
  """One (variant, moe_impl) row: its compiled step, a state and a batch, and the step
  times taken so far (one step at a time, so rows can be interleaved)."""

  def __init__(self, name: str, batch: int, seq_len: int, moe_impl: str,
               attention_impl: str | None = None, dtype: str | None = None):
    overrides = dict(moe_impl=moe_impl)
    if attention_impl:
      overrides["attention_impl"] = attention_impl
    if dtype:
      overrides["dtype"] = dtype
    self.name, self.moe_impl, self.batch, self.seq_len = name, moe_impl, batch, seq_len
    self.cfg = variants.get(name, **overrides)
    optimizer, _ = train.make_optimizer(learning_rate=1e-3, total_steps=1000)
    self.state = train.create_train_state(self.cfg, optimizer, jax.random.key(0))
    self.step = jax.jit(functools.partial(train.train_step, self.cfg, optimizer),
                        donate_argnums=0)
    tokens = np.random.default_rng(0).integers(0, self.cfg.vocab_size,
                                               size=(batch, seq_len + 1))
    self.batch_arrays = {
        "inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
        "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
        "positions": jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32),
                                      (batch, seq_len)),
        "segment_ids": jnp.ones((batch, seq_len), jnp.int32),
        "loss_mask": jnp.ones((batch, seq_len), jnp.float32)}
    self.compile_s = self.time_step()  # the first call compiles
    self.step_seconds: list[float] = []

  def time_step(self) -> float:
    start = time.perf_counter()
    self.state, metrics = self.step(self.state, self.batch_arrays)
    jax.block_until_ready(metrics)
    return time.perf_counter() - start

  def result(self) -> dict:
    """The best step time (on a shared machine the least disturbed one)."""
    seconds = min(self.step_seconds)
    tokens_per_s = self.batch * self.seq_len / seconds
    flops = roofline.train_flops_per_token(self.cfg, self.seq_len)
    return dict(variant=self.name, moe_impl=self.moe_impl, batch=self.batch,
                seq_len=self.seq_len, step_ms=seconds * 1e3, tokens_per_s=tokens_per_s,
                compile_s=self.compile_s, model_tflops=tokens_per_s * flops / 1e12,
                cfg=self.cfg)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variants", default="tiny,small")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq_len", type=int, default=256)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--moe_impls", default="dense,ragged")
  parser.add_argument("--attention_impl", default="",
                      help="model.attention_impl for every row (default: the variant's)")
  parser.add_argument("--dtype", default="",
                      help="model.dtype (compute) for every row; default: the variant's on "
                           "CPU, bfloat16 on an accelerator (the ceiling's dtype)")
  parser.add_argument("--smoke", action="store_true",
                      help="tiny, 2x32 tokens, one step, ragged MoE (the suite runs it)")
  args = parser.parse_args(argv)
  # As `c2jax` does at start-up (C2JAX_RETAIN_FREED_MEMORY=0 measures without it).
  host_memory.retain_freed_memory()
  if args.smoke:
    for key, value in SMOKE.items():
      setattr(args, key, value)
  device = jax.devices()[0]
  dtype = jnp.float32 if device.platform == "cpu" else jnp.bfloat16
  compute_dtype = args.dtype or (None if device.platform == "cpu" else jnp.dtype(dtype).name)
  # Large enough to fill the device: 2048^3 reached 107 TFLOP/s on an H200, 8192^3 ~600.
  matmul_n = 512 if args.smoke else 2048 if device.platform == "cpu" else 8192
  ceiling = accelerators.matmul_ceiling(dtype, n=matmul_n)
  acc = accelerator_of(device, ceiling, (16 if args.smoke else 256) << 20)
  print(f"train step throughput, {datetime.date.today()}, {device.platform} "
        f"({device.device_kind}), {jax.device_count()} device(s), jax {jax.__version__}, "
        f"load average {_load_average()}")
  print(f"ceiling: {jnp.dtype(dtype).name} {matmul_n}^3 matmul = {ceiling / 1e12:.3f} TFLOP/s "
        f"(first measurement); roofline device: {acc.name}, {acc.bf16_tflops:.3f} TFLOP/s "
        f"peak, {acc.hbm_tb_s:.3f} TB/s\n")
  rows = [Row(name, args.batch, args.seq_len, impl, args.attention_impl or None,
              compute_dtype)
          for name in args.variants.split(",") for impl in args.moe_impls.split(",")]
  # Round-robin: every row and the ceiling are measured once per round, so a drifting
  # machine load reaches all of them alike.
  for round_index in range(args.steps):
    for row in rows:
      row.step_seconds.append(row.time_step())
    ceiling = max(ceiling, accelerators.matmul_ceiling(dtype, n=matmul_n, repeats=1))
    print(f"round {round_index + 1}/{args.steps}: " + ", ".join(
        f"{row.name} {row.moe_impl} {row.step_seconds[-1] * 1e3:.0f} ms" for row in rows),
          flush=True)
  rows = [row.result() for row in rows]
  header = (f"{'variant':<10} {'moe_impl':<8} {'attention':<9} {'dtype':<8} {'batch x len':>11} "
            f"{'step ms':>9} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'MFU peak':>8} "
            f"{'bound ms':>9} {'of bound':>8} {'compile s':>9}")
  print(f"\nMFU over the best ceiling measured in this run: {ceiling / 1e12:.4f} TFLOP/s; "
        f"load average {_load_average()}\n")
  print(header)
  print("-" * len(header))
  for r in rows:
    bound = step_bound(r["cfg"], args.batch, args.seq_len, acc)
    print(f"{r['variant']:<10} {r['moe_impl']:<8} {r['cfg'].attention_impl:<9} "
          f"{r['cfg'].dtype:<8} "
          f"{f'{args.batch}x{args.seq_len}':>11} "
          f"{r['step_ms']:>9.2f} {r['tokens_per_s']:>10,.0f} {r['model_tflops']:>8.4f} "
          f"{r['model_tflops'] * 1e12 / ceiling:>6.1%} "
          f"{r['model_tflops'] / acc.bf16_tflops:>8.1%} {bound.lower_s * 1e3:>9.2f} "
          f"{bound.lower_s * 1e3 / r['step_ms']:>8.1%} {r['compile_s']:>9.1f}")


def _load_average() -> str:
  try:
    return " ".join(open("/proc/loadavg").read().split()[:3])
  except OSError:  # not Linux
    return "n/a"


if __name__ == "__main__":
  main()
