"""MTP heads in RL: config validation, the online self-distillation loss (it trains the
heads and leaves the policy's update exactly as without it), and grouped clipping."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from c2jax import config as configlib
from c2jax import model
from c2jax.model import mtp
from c2jax.rl import config as rl_config
from c2jax.rl import job
from c2jax.rl.learner import step as learner
from c2jax.rl.learner import runtime as learner_runtime
from c2jax.rl.learner import mtp_distill
from c2jax.rollout import weights as weights_lib
from c2jax.train import optimizer as optimizer_lib
from c2jax.train.step import TrainState
from tests.model.conftest import tiny_cfg

B, L = 2, 16


@pytest.fixture(scope="module")
def setup():
  cfg = tiny_cfg(vocab_size=64, num_layers=2, num_mtp_layers=1)
  params = model.init(cfg, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, cfg.vocab_size, (B, L)).astype(np.int32)
  valid = np.ones((B, L), np.int32)
  valid[1, 12:] = 0
  _, aux, _ = model.apply(cfg, params, jnp.asarray(tokens), segment_ids_BxL=valid)
  loss_mask = np.zeros((B, L), np.int32)
  loss_mask[:, 6:] = 1
  batch = dict(tokens=tokens, valid=valid, loss_mask=loss_mask,
               router_indices=np.asarray(aux["expert_indices"]).transpose(1, 2, 0, 3),
               advantages=np.float32([1.0, -1.0]),
               sampler_logprobs=rng.normal(-4.0, 0.1, (B, L)).astype(np.float32))
  return cfg, params, {k: jnp.asarray(v) for k, v in batch.items()}


def _rl_cfg(mtp_loss_weight):
  c = rl_config.default_config()
  c.kl.coef = 0.0
  c.mtp_loss_weight = mtp_loss_weight
  c.mtp_seq_chunk = 5  # chunked, and not a divisor of L
  rl_config.validate(c)
  return c


_STEPS = {}  # mtp_loss_weight -> (optimizer, jitted step): one compile each per module


def _step_fn(cfg, mtp_loss_weight):
  if mtp_loss_weight not in _STEPS:
    # A tiny clip norm: both gradients are clipped, so a shared clip would couple them.
    optimizer, _ = optimizer_lib.make_optimizer(
        learning_rate=1e-2, total_steps=10, weight_decay=0.0, end_lr_fraction=1.0,
        clip_norm=1e-3, clip_group=learner_runtime.clip_group)
    _STEPS[mtp_loss_weight] = optimizer, jax.jit(functools.partial(
        learner.rl_step, _rl_cfg(mtp_loss_weight), cfg, optimizer, rollouts_per_step=B))
  return _STEPS[mtp_loss_weight]


def _run(cfg, params, batch, mtp_loss_weight, steps=1):
  optimizer, step = _step_fn(cfg, mtp_loss_weight)
  state = TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))
  history = []
  for _ in range(steps):
    state, metrics = step(state, None, batch)
    history.append(jax.device_get(metrics))
  return state.params, history


def _split(params):
  return ({k: v for k, v in params.items() if k != mtp.PARAMS_KEY}, params[mtp.PARAMS_KEY])


def test_config_requires_mtp_modules_for_speculation():
  cfg = job.job_defaults("tiny")
  job.validate(cfg)
  cfg.actors.num_draft_tokens = 2
  with pytest.raises(configlib.ConfigError, match="actors.num_draft_tokens.*num_mtp_layers"):
    job.validate(cfg)
  cfg.model.num_mtp_layers = 1
  job.validate(cfg)
  cfg.actors.num_draft_tokens = -1
  with pytest.raises(configlib.ConfigError, match="actors.num_draft_tokens"):
    job.validate(cfg)
  cfg.actors.num_draft_tokens = 2
  cfg.rl.mtp_loss_weight = -0.5
  with pytest.raises(configlib.ConfigError, match="rl.mtp_loss_weight"):
    job.validate(cfg)
  cfg.rl.mtp_loss_weight = 1.0
  cfg.rl.mtp_lr_scale = -1.0
  with pytest.raises(configlib.ConfigError, match="rl.mtp_lr_scale"):
    job.validate(cfg)
  cfg.rl.mtp_lr_scale = 1.0
  cfg.rl.mtp_seq_chunk = 0
  with pytest.raises(configlib.ConfigError, match="rl.mtp_seq_chunk"):
    job.validate(cfg)


@pytest.mark.slow
def test_mtp_loss_reaches_only_the_mtp_heads(setup):
  cfg, params, batch = setup
  hidden, _, _ = model.apply(cfg, params, batch["tokens"], segment_ids_BxL=batch["valid"],
                             head=False)
  grads = jax.grad(lambda p: mtp_distill.loss(cfg, p, hidden, batch, seq_chunk=5)[0])(params)
  main, heads = _split(grads)
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(main))
  assert float(sum(jnp.abs(g).sum() for g in jax.tree.leaves(heads))) > 0


def test_mtp_loss_counts_only_depths_predicting_generated_tokens(setup):
  cfg, params, batch = setup
  hidden, _, _ = model.apply(cfg, params, batch["tokens"], segment_ids_BxL=batch["valid"],
                             head=False)
  base, _, _ = mtp_distill.loss(cfg, params, hidden, batch, seq_chunk=5)
  # Without generated tokens no position is trained: the loss is 0.
  empty = dict(batch, loss_mask=jnp.zeros_like(batch["loss_mask"]))
  assert float(mtp_distill.loss(cfg, params, hidden, empty, seq_chunk=5)[0]) == 0.0
  assert float(base) > 0.0


@pytest.mark.slow
def test_online_mtp_training_leaves_the_policy_update_unchanged(setup):
  cfg, params, batch = setup
  with_mtp, history = _run(cfg, params, batch, 1.0)
  without, plain_history = _run(cfg, params, batch, 0.0)
  main_a, heads_a = _split(with_mtp)
  main_b, heads_b = _split(without)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(main_a), jax.tree.leaves(main_b)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b),
                                  err_msg=jax.tree_util.keystr(path))
  # Weight 0: the heads get no gradient and stay; weight 1: they move.
  for a, b in zip(jax.tree.leaves(heads_b), jax.tree.leaves(params[mtp.PARAMS_KEY])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(heads_a),
                                                       jax.tree.leaves(heads_b)))
  assert history[0]["grad_norm"] == plain_history[0]["grad_norm"]
  assert history[0]["mtp_grad_norm"] > 0 and "mtp0/kl" in history[0]
  assert "mtp_loss" not in plain_history[0]


def test_grouped_clip_scales_each_group_by_its_own_norm():
  grads = {"lm_head": {"kernel": jnp.full((4,), 1.5)},          # norm 3
           mtp.PARAMS_KEY: {"w": jnp.full((4,), 2.0)},          # norm 4
           "embed": {"embedding": jnp.zeros((2,))}}
  grouped = optimizer_lib.clip_by_group_norm(1.0, learner_runtime.clip_group)
  clipped, _ = grouped.update(grads, grouped.init(grads))
  np.testing.assert_allclose(clipped["lm_head"]["kernel"], 0.5)
  np.testing.assert_allclose(clipped[mtp.PARAMS_KEY]["w"], 0.5)
  # One global clip (norm 5) would couple them: the policy's part depends on the heads'.
  shared = optax.clip_by_global_norm(1.0)
  together, _ = shared.update(grads, shared.init(grads))
  np.testing.assert_allclose(together["lm_head"]["kernel"], 0.3, rtol=1e-6)
  # Below the norm nothing changes.
  small = jax.tree.map(lambda g: g / 10, grads)
  kept, _ = grouped.update(small, grouped.init(small))
  np.testing.assert_allclose(kept["lm_head"]["kernel"], 0.15, rtol=1e-6)


def test_heads_learning_rate_scale_applies_to_the_heads_alone():
  params = {"lm_head": {"kernel": jnp.ones(3)}, mtp.PARAMS_KEY: {"w": jnp.ones(3)}}
  optimizer, _ = optimizer_lib.make_optimizer(
      learning_rate=1.0, total_steps=10, weight_decay=0.0, end_lr_fraction=1.0,
      clip_group=learner_runtime.clip_group, group_lr_scale={"mtp": 0.1})
  updates, _ = optimizer.update(params, optimizer.init(params), params)
  np.testing.assert_allclose(updates["lm_head"]["kernel"], -1.0, rtol=1e-6)
  np.testing.assert_allclose(updates[mtp.PARAMS_KEY]["w"], -0.1, rtol=1e-6)
  with pytest.raises(ValueError, match="group_lr_scale needs clip_group"):
    optimizer_lib.make_optimizer(learning_rate=1.0, total_steps=10, group_lr_scale={"x": 1})


def test_online_distillation_lowers_the_kl_to_the_policy(setup):
  cfg, params, batch = setup
  _, history = _run(cfg, params, batch, 1.0, steps=8)
  kls = [h["mtp0/kl"] for h in history]
  assert kls[-1] < 0.8 * kls[0], kls


def test_published_weights_carry_the_trained_heads(setup, tmp_path):
  cfg, params, batch = setup
  trained, _ = _run(cfg, params, batch, 1.0)
  publisher = weights_lib.WeightPublisher(tmp_path / "w", full_every=4)
  publisher.publish(params, 0, full=True)
  publisher.publish(trained, 1)
  subscriber = weights_lib.WeightSubscriber(tmp_path / "w")
  loaded, version = subscriber.poll()
  assert version == 1
  for a, b in zip(jax.tree.leaves(loaded[mtp.PARAMS_KEY]),
                  jax.tree.leaves(trained[mtp.PARAMS_KEY])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
