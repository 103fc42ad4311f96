"""Gradient accumulation in the train step: N microbatches give the parameters and metrics
of the whole batch taken at once, and the step's peak temporaries fall as N grows."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from c2jax import config as configlib
from c2jax import train
from c2jax.train import accumulate, jobs
from c2jax.train.step import MTPWeights
from tests.model.conftest import GQA_OVERRIDES, random_params, tiny_cfg

B, L, VOCAB = 8, 16, 32


def _batch(seed=0):
  """Rows of unequal weight: padding tails, a row with no trained token, a fully padded
  row, two documents per row, so every normaliser (tokens, rows, MTP positions) matters."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, VOCAB, (B, L + 1))
  segments = np.ones((B, L), np.int32)
  segments[:, L // 2:] = 2
  for row, valid in enumerate((16, 12, 5, 16, 0, 9, 16, 3)):
    segments[row, valid:] = 0
  mask = (segments != 0).astype(np.float32)
  mask[3] = 0.0  # a prompt-only row: in the balance loss, out of the cross entropy
  mask[:, :2] = 0.0
  positions = np.tile(np.arange(L), (B, 1))
  return {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
          "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
          "positions": jnp.asarray(positions, jnp.int32),
          "segment_ids": jnp.asarray(segments), "loss_mask": jnp.asarray(mask)}


def _moe_cfg(**overrides):
  """One MoE layer (GQA: the quickest to compile), the balance loss and bias updates on."""
  moe = dict(GQA_OVERRIDES["moe"], router="sigmoid_bias", aux_loss_coef=0.01,
             bias_update_rate=1e-2)
  return tiny_cfg(**{**GQA_OVERRIDES, "moe": moe, "num_layers": 1, "first_k_dense": 0,
                     **overrides})


@pytest.fixture(scope="module")
def moe_mtp():
  """The MoE layer and an MTP module (itself a MoE block)."""
  cfg = _moe_cfg(vocab_size=VOCAB, num_mtp_layers=1)
  return cfg, random_params(cfg)


def _train(cfg, params, microbatches, steps=3):
  # Plain SGD: the parameters then differ exactly as the gradients do (Adam's first steps
  # divide by |g| and blow float noise in near-zero gradients up to a whole step).
  opt = optax.sgd(0.1)
  state = train.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                           opt_state=opt.init(params))
  step = jax.jit(functools.partial(train.train_step, cfg, opt,
                                   mtp=MTPWeights(kl_weight=1.0, ce_weight=0.5),
                                   microbatches=microbatches))
  history = []
  for i in range(steps):
    state, metrics = step(state, _batch(i))
    history.append(jax.device_get(metrics))
  return state, history


def test_four_microbatches_match_one_batch(moe_mtp):
  cfg, params = moe_mtp
  whole, whole_history = _train(cfg, params, 1)
  micro, micro_history = _train(cfg, params, 4)
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(micro.params)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  for first, second in zip(whole_history, micro_history):
    assert set(first) == set(second)
    for key in first:
      np.testing.assert_allclose(second[key], first[key], rtol=1e-5, atol=1e-6, err_msg=key)
  # The terms the normalisation is about were all in play.
  assert whole_history[0]["aux_loss"] > 0 and whole_history[0]["mtp0/ce"] > 0
  # The correction biases moved (the summed expert loads drove the same sign updates).
  biases = lambda tree: [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
                         if "correction_bias" in jax.tree_util.keystr(path)]
  assert len(biases(params)) == 2  # the trunk's MoE layer and the MTP block's
  for before, after in zip(biases(params), biases(micro.params)):
    assert not np.array_equal(before, after)


@pytest.mark.slow
def test_peak_temporaries_fall_with_more_microbatches():
  cfg = _moe_cfg(vocab_size=512)
  params = jax.eval_shape(lambda: random_params(cfg))
  opt, _ = train.make_optimizer(learning_rate=1e-3, total_steps=10)
  state = train.TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                           opt_state=jax.eval_shape(opt.init, params))
  rows, length = 16, 64
  batch = {key: jax.ShapeDtypeStruct((rows, length), jnp.float32 if key == "loss_mask"
                                     else jnp.int32) for key in jobs.BATCH_KEYS}
  temps = {}
  for n in (1, 2, 4):
    step = jax.jit(functools.partial(train.train_step, cfg, opt, microbatches=n))
    temps[n] = step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
  assert temps[1] > temps[2] > temps[4], temps
  assert temps[4] < 0.6 * temps[1], temps


def test_split_is_strided_so_devices_keep_their_rows():
  batch = {"x": jnp.arange(8)[:, None] * jnp.ones((1, 3), jnp.int32)}
  micro = accumulate.split(batch, 4)["x"]
  assert micro.shape == (4, 2, 3)
  np.testing.assert_array_equal(micro[:, :, 0], [[0, 4], [1, 5], [2, 6], [3, 7]])


def test_validation_names_the_key():
  cfg = jobs.job_defaults()
  cfg.train.batch_size, cfg.train.microbatches = 8, 3
  with pytest.raises(configlib.ConfigError, match="train.microbatches"):
    jobs.validate(cfg)
  cfg.train.microbatches = 4
  jobs.validate(cfg, num_devices=1)
  # 8 rows over 4 microbatches leaves 2 per microbatch: too few for 4 (fsdp) devices.
  with pytest.raises(configlib.ConfigError, match="train.microbatches.*4 x 4"):
    jobs.validate(cfg, num_devices=4)
