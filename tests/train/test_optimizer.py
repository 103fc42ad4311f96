"""Optimizer: frozen correction bias, no decay on 1-D params, schedules; the train step."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import model, train
from c2jax.model import variants
from c2jax.train import optimizer as optimizer_lib


@pytest.fixture(scope="module")
def tiny():
  cfg = variants.get("tiny", vocab_size=256, moe={"bias_update_rate": 0.01})
  return cfg, model.init(cfg, jax.random.key(0))


def test_decay_mask_spares_norms_and_biases(tiny):
  _, params = tiny
  mask = optimizer_lib.weight_decay_mask(params)
  assert mask["lm_head"]["kernel"] and mask["embed"]["embedding"]
  assert mask["moe_layers"]["moe"]["experts"]["gate_proj"]
  assert not mask["final_norm"]["scale"]
  assert not mask["moe_layers"]["attn_norm"]["scale"]  # [layers, D]: still a norm scale
  assert not mask["moe_layers"]["moe"]["router"]["correction_bias"]


def test_optimizer_never_moves_the_correction_bias(tiny):
  _, params = tiny
  opt, _ = train.make_optimizer(learning_rate=1.0, total_steps=10, warmup_steps=0)
  grads = jax.tree_util.tree_map(jnp.ones_like, params)
  updates, _ = opt.update(grads, opt.init(params), params)
  assert not np.any(updates["moe_layers"]["moe"]["router"]["correction_bias"])
  assert np.all(updates["lm_head"]["kernel"] != 0)


def test_norm_scale_has_no_weight_decay(tiny):
  _, params = tiny
  opt, _ = train.make_optimizer(learning_rate=0.1, total_steps=10, warmup_steps=0,
                                weight_decay=0.5)
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  state = opt.init(params)
  for _ in range(3):  # past the warmup's zero step
    updates, state = opt.update(zeros, state, params)
  assert not np.any(updates["final_norm"]["scale"])  # zero grad, no decay: no update
  assert np.any(updates["lm_head"]["kernel"])  # decoupled decay moves kernels


@pytest.mark.parametrize("name", sorted(optimizer_lib.SCHEDULES))
def test_schedules_warm_up_then_decay(name):
  _, schedule = train.make_optimizer(learning_rate=1.0, total_steps=100, warmup_steps=10,
                                     schedule=name, end_lr_fraction=0.1)
  values = np.array([schedule(s) for s in range(101)])
  assert values[0] == 0.0 and values[10] == pytest.approx(1.0)
  assert np.all(np.diff(values[:11]) > 0)
  assert values[100] == pytest.approx(0.1, abs=1e-6)
  if name == "wsd":
    assert np.allclose(values[10:80], 1.0)  # stable plateau before the final 20% decay


def test_train_step_updates_bias_outside_optimizer(tiny):
  cfg, params = tiny
  opt, _ = train.make_optimizer(learning_rate=1e-3, total_steps=10)
  state = train.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                           opt_state=opt.init(params))
  tokens = jax.random.randint(jax.random.key(1), (2, 17), 0, cfg.vocab_size)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "positions": jnp.broadcast_to(jnp.arange(16), (2, 16)),
           "segment_ids": jnp.ones((2, 16), jnp.int32),
           "loss_mask": jnp.ones((2, 16), jnp.float32)}
  step = jax.jit(functools.partial(train.train_step, cfg, opt))
  new_state, metrics = step(state, batch)
  assert int(new_state.step) == 1 and np.isfinite(float(metrics["loss"]))
  _, stats = train.loss_fn(cfg, params, batch)
  loads = np.asarray(stats["expert_loads"])
  delta = np.asarray(new_state.params["moe_layers"]["moe"]["router"]["correction_bias"]
                     - params["moe_layers"]["moe"]["router"]["correction_bias"])
  expected = 0.01 * np.sign(loads.mean(axis=-1, keepdims=True) - loads)
  np.testing.assert_allclose(delta, expected, atol=1e-6)
