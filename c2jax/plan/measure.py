"""Measured step times on this machine, to hold a roofline against (`c2jax plan --measure`).

Both run the product's own code: the train step the training loop jits (random tokens,
fresh parameters) and the rollout engine's decode step (random prompts of the decode
context, greedy; the steady state after prefill). Compile time is excluded.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from c2jax import model
from c2jax.rollout import JaxEngine, Request, SamplingParams
from c2jax.train import loop


def train_step_seconds(cfg, steps: int = 3) -> float:
  """Seconds per step of the job config's train step, best of `steps` after a warm-up."""
  rt = loop.build_runtime(cfg)
  step = loop.make_train_step(rt)
  state = loop.init_state(rt)
  rng = np.random.default_rng(0)
  batch_size, seq_len = cfg.train.batch_size, cfg.train.seq_len
  tokens = rng.integers(0, cfg.model.vocab_size, size=(batch_size, seq_len + 1))
  batch = loop.device_batch(rt, {
      "inputs": tokens[:, :-1].astype(np.int32), "targets": tokens[:, 1:].astype(np.int32),
      "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch_size, seq_len)),
      "segment_ids": np.ones((batch_size, seq_len), np.int32),
      "loss_mask": np.ones((batch_size, seq_len), np.float32)})
  best = float("inf")
  with rt.scope():
    for i in range(steps + 1):
      start = time.perf_counter()
      state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
      if i:  # the first call compiles
        best = min(best, time.perf_counter() - start)
  return best


def decode_step_seconds(model_cfg, batch: int, context: int, new_tokens: int = 16) -> float:
  """Seconds per decode step of `batch` sequences whose prompts are `context` tokens."""

  params = model.init(model_cfg, jax.random.key(0))
  engine = JaxEngine(model_cfg, params, num_slots=batch,
                     max_length=context + new_tokens + 8, prefill_buckets=(context,))
  rng = np.random.default_rng(0)
  prompts = rng.integers(0, model_cfg.vocab_size, size=(batch, context))
  requests = [Request(prompt, SamplingParams(temperature=0.0, max_tokens=new_tokens))
              for prompt in prompts]
  engine.generate(requests[:1])  # compiles prefill and decode
  ids = [engine.submit(r) for r in requests]
  done = {g.seq_id for g in engine.step()}  # admits and prefills every request
  steps = 0
  start = time.perf_counter()
  while len(done) < len(ids):
    done.update(g.seq_id for g in engine.step())
    steps += 1
  return (time.perf_counter() - start) / max(steps, 1)
