"""Qwen3 dense (HF Qwen3ForCausalLM) end to end: the transformers fixture loads, decodes in
the engine's per-layer decode layout with the teacher-forced greedy tokens, and trains.
(Logit parity with transformers is test_parity.py's, over every fixture case.)"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from c2jax import model, train
from c2jax.rollout import JaxEngine, Request, SamplingParams
from c2jax.train.step import TrainState, train_step
from tests.hf.conftest import FIXTURES

CASE = "qwen3_dense"


def test_fixture_is_a_dense_qwen3(loaded):
  cfg, params = loaded(CASE)
  assert cfg.name == "qwen3" and cfg.attention == "gqa" and cfg.qk_norm
  assert cfg.first_k_dense == cfg.num_layers and "moe_layers" not in params
  assert cfg.num_heads > cfg.num_kv_heads


def test_engine_decodes_greedily_in_the_decode_layout(loaded):
  cfg, params = loaded(CASE)
  engine = JaxEngine(cfg, params, num_slots=2, max_length=48, prefill_buckets=(16,))
  assert model.has_unstacked_layers(engine._params)  # the layout that pays on CPU
  prompts = np.load(FIXTURES / CASE / "tokens.npy")[:, :12]
  generations = engine.generate([Request(p, SamplingParams(temperature=0.0, max_tokens=10))
                                 for p in prompts])
  sequences = np.stack([np.concatenate([p, g.tokens]) for p, g in zip(prompts, generations)])
  logits = jax.jit(functools.partial(model.forward, cfg))(params, sequences[:, :-1])
  logp = np.asarray(jax.nn.log_softmax(logits, -1))[:, 11:]
  for row, generation in enumerate(generations):
    np.testing.assert_array_equal(generation.tokens, logp[row].argmax(-1))
    np.testing.assert_allclose(generation.logprobs,
                               logp[row, np.arange(10), generation.tokens], atol=1e-5)
    assert generation.expert_indices.shape == (12 + 10, 0, 2)  # no MoE layers


def test_trains_from_the_loaded_weights(loaded):
  cfg, params = loaded(CASE)
  optimizer, _ = train.make_optimizer(learning_rate=1e-2, total_steps=10, weight_decay=0.0,
                                      state_dtype=cfg.opt_state_dtype)
  params = jax.tree.map(jnp.asarray, params)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(params))
  tokens = np.load(FIXTURES / CASE / "tokens.npy")
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "positions": np.broadcast_to(np.arange(31), (2, 31)),
           "segment_ids": np.ones((2, 31), np.int32), "loss_mask": np.ones((2, 31))}
  step = jax.jit(functools.partial(train_step, cfg, optimizer))
  losses = []
  for _ in range(4):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
