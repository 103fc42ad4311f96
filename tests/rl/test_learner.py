"""rl_step on the tiny MoE model: log-probs, router replay, loss and update direction."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import model
from c2jax.model import config as model_config
from c2jax.rl import config as rl_config
from c2jax.rl.learner import step as learner
from c2jax.train import optimizer as optimizer_lib
from c2jax.train.step import TrainState

B, L = 2, 16


@pytest.fixture(scope="module")
def setup():
  cfg = model_config.defaults()
  cfg.vocab_size = 512
  model_config.validate(cfg)
  params = model.init(cfg, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, cfg.vocab_size, (B, L)).astype(np.int32)
  valid = np.ones((B, L), np.int32)
  valid[1, 11:] = 0  # row 1 is a shorter segment plus padding
  _, aux, _ = model.apply(cfg, params, jnp.asarray(tokens), segment_ids_BxL=valid)
  own_routes = np.asarray(aux["expert_indices"]).transpose(1, 2, 0, 3)  # [B, L, Lm, K]
  loss_mask = np.zeros((B, L), np.int32)
  loss_mask[:, 5:] = 1
  batch = dict(tokens=tokens, valid=valid, loss_mask=loss_mask,
               router_indices=own_routes, advantages=np.float32([1.0, -1.0]))
  return cfg, params, batch


def _rl_cfg(**kl):
  cfg = rl_config.default_config()
  cfg.kl.coef = 0.0
  cfg.kl.update(kl)
  rl_config.validate(cfg)
  return cfg


def _forward_logprobs(cfg, params, tokens, valid, temperature=1.0):
  logits = model.forward(cfg, params, jnp.asarray(tokens), segment_ids_BxL=jnp.asarray(valid))
  logp = jax.nn.log_softmax(logits[:, :-1] / temperature, -1)
  picked = jnp.take_along_axis(logp, jnp.asarray(tokens)[:, 1:, None], -1)[..., 0]
  return np.pad(np.asarray(picked), ((0, 0), (1, 0)))


def test_replaying_own_routes_gives_the_plain_forward_logprobs(setup):
  cfg, params, batch = setup
  logprobs, aux = learner.token_logprobs(cfg, params, batch)
  expected = _forward_logprobs(cfg, params, batch["tokens"], batch["valid"])
  np.testing.assert_allclose(np.asarray(logprobs), expected, atol=1e-6)
  assert float(jnp.abs(aux["replay_replaced"]).sum()) == 0.0


def test_chunked_logprobs_at_a_temperature_match_plain_values_and_param_grads(setup):
  cfg, params, batch = setup
  weights = jnp.asarray(np.random.default_rng(1).normal(size=(B, L)), jnp.float32)

  def chunked(p):  # 512 = 4 chunks of 100 (padded) + a partial sequence chunk
    logp, _ = learner.token_logprobs(cfg, p, batch, 0.7, seq_chunk=4, vocab_chunk=100)
    return (weights * logp).sum(), logp

  def plain(p):
    logits = model.forward(cfg, p, jnp.asarray(batch["tokens"]),
                           segment_ids_BxL=jnp.asarray(batch["valid"]))
    logp = jax.nn.log_softmax(logits[:, :-1] / 0.7, -1)
    picked = jnp.take_along_axis(logp, jnp.asarray(batch["tokens"])[:, 1:, None], -1)[..., 0]
    logp = jnp.pad(picked, ((0, 0), (1, 0)))
    return (weights * logp).sum(), logp

  (_, logp), grads = jax.value_and_grad(chunked, has_aux=True)(params)
  (_, ref_logp), ref_grads = jax.value_and_grad(plain, has_aux=True)(params)
  np.testing.assert_allclose(np.asarray(logp), np.asarray(ref_logp), atol=1e-5)
  for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(grads),
                          jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5,
                               err_msg=jax.tree_util.keystr(path))


def test_sampler_logprobs_at_the_same_temperature_are_on_policy(setup):
  # Actors sampling at T record log softmax(logits / T); the learner scores at the same T,
  # so every ratio is 1 (scoring at T = 1 instead would not be).
  cfg, params, batch = setup
  sampler = _forward_logprobs(cfg, params, batch["tokens"], batch["valid"], 0.5)
  batch = dict(batch, sampler_logprobs=sampler.astype(np.float32))
  _, metrics = _step(_rl_cfg(), cfg, params, batch, temperature=0.5)
  np.testing.assert_allclose(float(metrics["ratio_mean"]), 1.0, atol=1e-5)
  np.testing.assert_allclose(float(metrics["ratio_max"]), 1.0, atol=1e-5)
  assert float(metrics["mismatch_mean"]) < 1e-5 and float(metrics["mismatch_p99"]) < 1e-5
  _, metrics = _step(_rl_cfg(), cfg, params, batch, temperature=1.0)
  assert abs(float(metrics["ratio_mean"]) - 1.0) > 1e-2
  # The train-inference mismatch: |log pi - log mu| over the trained tokens.
  learner_logp = _forward_logprobs(cfg, params, batch["tokens"], batch["valid"], 1.0)
  trained = (batch["loss_mask"] * batch["valid"]) > 0
  gap = np.abs(learner_logp - sampler)[trained]
  np.testing.assert_allclose(float(metrics["mismatch_mean"]), gap.mean(), rtol=1e-4)
  np.testing.assert_allclose(float(metrics["mismatch_p99"]), np.quantile(gap, 0.99),
                             rtol=1e-4)


def _step(rl_cfg, cfg, params, batch, lr=1e-2, **kw):
  optimizer, _ = optimizer_lib.make_optimizer(learning_rate=lr, total_steps=10,
                                              weight_decay=0.0, end_lr_fraction=1.0)
  state = TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))
  step = jax.jit(functools.partial(learner.rl_step, rl_cfg, cfg, optimizer,
                                   rollouts_per_step=B, **kw))
  return step(state, params, {k: jnp.asarray(v) for k, v in batch.items()})


def test_loss_matches_hand_formula_and_update_follows_the_advantage(setup):
  cfg, params, batch = setup
  rl_cfg = _rl_cfg()
  before = _forward_logprobs(cfg, params, batch["tokens"], batch["valid"])
  batch = dict(batch, sampler_logprobs=before.astype(np.float32))  # on-policy: ratio 1
  state, metrics = _step(rl_cfg, cfg, params, batch)
  mask = batch["loss_mask"] * batch["valid"]
  # Dr. GRPO constant normaliser with TIS at ratio 1: -sum(A * logp * m) / (B * N).
  expected = -(batch["advantages"][:, None] * before * mask).sum() / (
      B * rl_cfg.loss.normalizer_tokens)
  np.testing.assert_allclose(float(metrics["loss"]), expected, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["ratio_mean"]), 1.0, atol=1e-5)
  assert int(state.step) == 1
  after = _forward_logprobs(cfg, state.params, batch["tokens"], batch["valid"])
  # The positive-advantage row becomes likelier, the negative one less likely.
  gain = ((after - before) * mask).sum(-1)
  assert gain[0] > 0 > gain[1]


def test_padding_and_untrained_tokens_do_not_change_the_update(setup):
  cfg, params, batch = setup
  rl_cfg = _rl_cfg()
  sampler = _forward_logprobs(cfg, params, batch["tokens"], batch["valid"]) - 0.1
  batch = dict(batch, sampler_logprobs=sampler.astype(np.float32))
  state_a, _ = _step(rl_cfg, cfg, params, batch)
  noisy = dict(batch)
  tokens = batch["tokens"].copy()
  tokens[1, 11:] = 7  # padding content
  sampler = batch["sampler_logprobs"].copy()
  sampler[:, :5] = -50.0  # untrained positions' sampler log-probs
  noisy.update(tokens=tokens, sampler_logprobs=sampler)
  state_b, _ = _step(rl_cfg, cfg, params, noisy)
  for a, b in zip(jax.tree.leaves(state_a.params), jax.tree.leaves(state_b.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_k1_kl_in_the_reward_shifts_the_loss_and_reports_kl(setup):
  cfg, params, batch = setup
  logprobs = _forward_logprobs(cfg, params, batch["tokens"], batch["valid"])
  batch = dict(batch, sampler_logprobs=(logprobs - 0.3).astype(np.float32))
  _, metrics = _step(_rl_cfg(coef=0.5, estimator="k1", placement="reward"), cfg, params,
                     batch)
  # The reference is the same params: k1 = log mu - log p_ref = -0.3 on every token.
  np.testing.assert_allclose(float(metrics["kl"]), -0.3, atol=1e-5)


def test_plausibility_filter_replaces_implausible_replayed_experts(setup):
  cfg, params, batch = setup
  filtered_cfg = cfg.copy_and_resolve_references()
  filtered_cfg.moe.replay_filter_factor = 1.0
  own = batch["router_indices"]
  _, aux = learner.token_logprobs(filtered_cfg, params, batch)
  assert float(aux["replay_mismatch"].max()) == 0.0
  assert float(aux["replay_replaced"].max()) == 0.0
  # Random replayed experts: many fall outside the router's own top-k.
  rng = np.random.default_rng(1)
  random_routes = np.stack([rng.permutation(cfg.moe.num_experts)[:cfg.moe.num_experts_per_tok]
                            for _ in range(int(np.prod(own.shape[:-1])))])
  random_routes = random_routes.reshape(own.shape).astype(np.int32)
  _, aux_random = learner.token_logprobs(filtered_cfg, params,
                                         dict(batch, router_indices=random_routes))
  assert float(aux_random["replay_mismatch"].mean()) > 0.3
  assert 0.0 < float(aux_random["replay_replaced"].mean()) <= float(
      aux_random["replay_mismatch"].mean()) + 1e-6
