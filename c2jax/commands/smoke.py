"""`c2jax smoke`: train a model variant for a few steps on a synthetic next-token task.

The task is learnable but not trivial: each row is an arithmetic progression modulo a
small alphabet with a random start and stride, so the model must read the stride from the
context. Loss should fall well below log(alphabet) within a few dozen steps at `tiny`.
"""

from __future__ import annotations

import functools
import json
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from ml_collections import config_flags

from c2jax import train
from c2jax.model import config as model_config

_CONFIG = config_flags.DEFINE_config_file("config", None, "Smoke config (configs/smoke.py).")
_METRICS = flags.DEFINE_string("metrics", None, "Optional JSONL file for per-step metrics.")


def synthetic_batch(rng: np.random.Generator, batch: int, length: int, alphabet: int):
  start = rng.integers(0, alphabet, size=(batch, 1))
  stride = rng.integers(1, 8, size=(batch, 1))
  seq = (start + stride * np.arange(length + 1)[None, :]) % alphabet
  return {
      "inputs": jnp.asarray(seq[:, :-1], jnp.int32),
      "targets": jnp.asarray(seq[:, 1:], jnp.int32),
      "positions": jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length)),
      "segment_ids": jnp.ones((batch, length), jnp.int32),
      "loss_mask": jnp.ones((batch, length), jnp.float32),
  }


def main(argv) -> int:
  if len(argv) > 1:
    raise SystemExit(f"c2jax smoke: unexpected arguments {argv[1:]}")
  cfg = _CONFIG.value
  if cfg is None:
    raise SystemExit("c2jax smoke: pass --config=configs/smoke.py:<variant>")
  model_config.validate(cfg.model)
  optimizer, _ = train.make_optimizer(learning_rate=cfg.learning_rate,
                                      total_steps=cfg.steps, warmup_steps=cfg.warmup_steps,
                                      state_dtype=cfg.model.opt_state_dtype)
  state = train.create_train_state(cfg.model, optimizer, jax.random.key(cfg.seed))
  step_fn = jax.jit(functools.partial(train.train_step, cfg.model, optimizer),
                    donate_argnums=0)
  alphabet = min(cfg.model.vocab_size, 64)
  rng = np.random.default_rng(cfg.seed)
  metrics_file = open(_METRICS.value, "w") if _METRICS.value else None
  print(f"smoke: {cfg.model.name}, {cfg.steps} steps of {cfg.batch_size}x{cfg.seq_len} "
        f"tokens; loss starts near log(vocab) = {math.log(cfg.model.vocab_size):.2f} and "
        f"should fall below log({alphabet}) = {math.log(alphabet):.2f}", flush=True)
  start = time.time()
  first = last = None
  for step in range(1, cfg.steps + 1):
    state, metrics = step_fn(state, synthetic_batch(rng, cfg.batch_size, cfg.seq_len,
                                                    alphabet))
    if step % cfg.log_every == 0 or step in (1, cfg.steps):
      row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
      first = first if first is not None else row["loss"]
      last = row["loss"]
      elapsed = time.time() - start
      rate = step * cfg.batch_size * cfg.seq_len / elapsed
      eta = (cfg.steps - step) * elapsed / step
      print(f"step {step:>5}/{cfg.steps}  loss {row['loss']:.4f}  "
            f"grad_norm {row['grad_norm']:.3f}  {rate:,.0f} tok/s  ETA {eta:.0f}s", flush=True)
      if metrics_file:
        metrics_file.write(json.dumps(row) + "\n")
  if metrics_file:
    metrics_file.close()
  if not math.isfinite(last):
    raise SystemExit(f"smoke: loss is {last} at the end; training diverged.")
  print(f"smoke: loss {first:.4f} -> {last:.4f} in {time.time() - start:.1f}s")
  return 0
