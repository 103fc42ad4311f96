"""The train step with MTP modules: the loss adds the weighted MTP loss, it trains, and a
frozen trunk neither receives MTP gradients nor changes."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import config as configlib
from c2jax import train
from c2jax.model import mtp
from c2jax.train import jobs
from c2jax.train.step import MTPWeights
from tests.model.conftest import MLA_OVERRIDES, random_params, tiny_cfg

B, L, VOCAB = 2, 16, 32


@pytest.fixture(scope="module")
def tiny():
  cfg = tiny_cfg(vocab_size=VOCAB, num_layers=2, num_mtp_layers=1, **MLA_OVERRIDES)
  params = random_params(cfg)  # model.init's tree: includes params['mtp_layers']
  assert mtp.PARAMS_KEY in params
  # A learnable stream (each token repeats a short cycle) so losses can fall in few steps.
  tokens = (np.arange(L + 1)[None] * np.array([[3], [5]]) + np.array([[1], [2]])) % 7
  batch = {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
           "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
           "positions": jnp.broadcast_to(jnp.arange(L), (B, L)),
           "segment_ids": jnp.ones((B, L), jnp.int32),
           "loss_mask": jnp.ones((B, L), jnp.float32)}
  return cfg, params, batch


def _run(cfg, params, batch, weights, steps):
  opt, _ = train.make_optimizer(learning_rate=1e-2, total_steps=steps, weight_decay=0.1)
  state = train.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                           opt_state=opt.init(params))
  step = jax.jit(functools.partial(train.train_step, cfg, opt, mtp=weights))
  history = []
  for _ in range(steps):
    state, metrics = step(state, batch)
    history.append(jax.tree.map(float, metrics))
  return state, history


def test_joint_training_adds_and_reduces_the_mtp_loss(tiny):
  cfg, params, batch = tiny
  weights = MTPWeights(kl_weight=1.0, ce_weight=0.5)
  state, history = _run(cfg, params, batch, weights, steps=8)
  first, last = history[0], history[-1]
  assert {"mtp_loss", "mtp0/kl", "mtp0/ce", "mtp0/agree"} <= set(first)
  np.testing.assert_allclose(
      first["loss"], first["ce_loss"] + first["aux_loss"] + first["mtp_loss"], rtol=1e-5)
  np.testing.assert_allclose(first["mtp_loss"], first["mtp0/kl"] + 0.5 * first["mtp0/ce"],
                             rtol=1e-5)
  assert last["mtp_loss"] < 0.7 * first["mtp_loss"]
  assert last["ce_loss"] < first["ce_loss"]
  # Jointly trained: the trunk moves too.
  assert not np.array_equal(state.params["lm_head"]["kernel"], params["lm_head"]["kernel"])


def test_frozen_trunk_trains_only_the_mtp_modules(tiny):
  cfg, params, batch = tiny
  state, history = _run(cfg, params, batch, MTPWeights(frozen_trunk=True), steps=4)
  assert history[-1]["mtp_loss"] < history[0]["mtp_loss"]
  # Nothing outside mtp_layers changes: no gradient, no weight decay, no bias update.
  for key in params:
    same = jax.tree.leaves(jax.tree.map(lambda a, b: np.array_equal(a, b),
                                        state.params[key], params[key]))
    assert all(same) == (key != mtp.PARAMS_KEY), key
  # The main loss is unchanged because the main model is.
  np.testing.assert_allclose(history[-1]["ce_loss"], history[0]["ce_loss"], rtol=1e-6)


def _main_grads(cfg, params, batch, weights):
  return jax.jit(jax.grad(lambda p: train.loss_fn(cfg, p, batch, weights)[0]))(params)


@pytest.mark.slow
def test_frozen_trunk_gets_no_gradient_from_the_mtp_term(tiny):
  cfg, params, batch = tiny
  without = _main_grads(cfg, params, batch, MTPWeights(kl_weight=0.0))
  frozen = _main_grads(cfg, params, batch, MTPWeights(kl_weight=1.0, frozen_trunk=True))
  joint = _main_grads(cfg, params, batch, MTPWeights(kl_weight=1.0))
  for key in ("embed", "lm_head", "moe_layers", "dense_layers"):
    for a, b, c in zip(jax.tree.leaves(frozen[key]), jax.tree.leaves(without[key]),
                       jax.tree.leaves(joint[key])):
      np.testing.assert_allclose(a, b, atol=1e-7, err_msg=key)
    assert any(not np.allclose(a, c, atol=1e-6) for a, c in zip(
        jax.tree.leaves(frozen[key]), jax.tree.leaves(joint[key]))), key
  assert all(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(
      frozen[mtp.PARAMS_KEY]["eh_proj"]))
  assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(
      without[mtp.PARAMS_KEY]["eh_proj"]))


def test_train_config_fields():
  t = jobs.train_defaults()
  assert MTPWeights.from_train_config(t) == MTPWeights(1.0, 0.0, False)
  t.mtp_ce_weight, t.mtp_frozen_trunk = 0.25, True
  assert MTPWeights.from_train_config(t) == MTPWeights(1.0, 0.25, True)
  cfg = jobs.job_defaults()
  cfg.train.mtp_kl_weight = -1.0
  with pytest.raises(configlib.ConfigError, match="train.mtp_kl_weight"):
    jobs.validate(cfg)


@pytest.mark.parametrize("mtp_chunk", [0, 8])  # the MTP loss from full logits; chunked
def test_vocab_chunked_cross_entropy_matches_the_full_logits(tiny, mtp_chunk):
  # train.loss_vocab_chunk: the main loss from the final hidden state over chunks of 5
  # columns (7 chunks, the last padded) against the full float32 logits.
  cfg, params, batch = tiny
  weights = MTPWeights(kl_weight=1.0, ce_weight=0.5, vocab_chunk=mtp_chunk)
  run = lambda chunk: jax.jit(jax.value_and_grad(
      lambda p: train.loss_fn(cfg, p, batch, weights, vocab_chunk=chunk), has_aux=True))(params)
  (loss, stats), grads = run(5)
  (ref_loss, ref_stats), ref_grads = run(0)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for key in ("ce_loss", "mtp_loss", "mtp0/kl", "mtp0/ce", "mtp0/agree"):
    np.testing.assert_allclose(stats[key], ref_stats[key], rtol=1e-6, err_msg=key)
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6), grads, ref_grads)
  cfg_bad = jobs.job_defaults()
  cfg_bad.train.loss_vocab_chunk = -1
  with pytest.raises(configlib.ConfigError, match="train.loss_vocab_chunk"):
    jobs.validate(cfg_bad)


def test_tokamax_cross_entropy_matches_c2jax(tiny):
  """train.loss_impl='tokamax' (its XLA implementation on a CPU, float32 here) gives the
  loss, statistics and gradients of the full-logits loss, MTP terms included; a
  vocabulary its TPU kernel would read past is a ConfigError."""
  cfg, params, batch = tiny
  weights = MTPWeights(kl_weight=1.0, ce_weight=0.5, vocab_chunk=8)
  run = lambda impl: jax.jit(jax.value_and_grad(
      lambda p: train.loss_fn(cfg, p, batch, weights, loss_impl=impl), has_aux=True))(params)
  (loss, stats), grads = run("tokamax")
  (ref_loss, ref_stats), ref_grads = run("c2jax")
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  for key in ("ce_loss", "mtp_loss"):
    np.testing.assert_allclose(stats[key], ref_stats[key], rtol=1e-5, err_msg=key)
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-5), grads, ref_grads)
  cfg_bad = jobs.job_defaults()
  cfg_bad.train.loss_impl = "tokamax"
  cfg_bad.model.vocab_size = cfg_bad.data.vocab_size + 1000
  with pytest.raises(configlib.ConfigError,
                     match=f"loss_impl.*multiple of 128.*{cfg_bad.model.vocab_size}"):
    jobs.validate(cfg_bad)
