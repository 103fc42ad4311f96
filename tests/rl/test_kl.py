"""KL estimators k1/k2/k3 and the reward-to-go penalty, by hand and by exact expectation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.rl.learner import kl


@pytest.mark.parametrize("log_r, expected", [
    (-1.0, {"k1": 1.0, "k2": 0.5, "k3": math.exp(-1.0)}),          # e^-1 - 1 + 1
    (0.5, {"k1": -0.5, "k2": 0.125, "k3": math.exp(0.5) - 1.5}),
    (0.0, {"k1": 0.0, "k2": 0.0, "k3": 0.0}),
])
def test_hand_values(log_r, expected):
  logq = -2.0
  logp = logq + log_r
  for name, value in expected.items():
    np.testing.assert_allclose(float(kl.kl_estimate(name, jnp.float32(logq), logp)),
                               value, rtol=1e-6, atol=1e-7)


def test_k1_and_k3_unbiased_k2_biased_on_a_categorical():
  # Exact expectations over x ~ q on 3 outcomes: E[k1] = E[k3] = KL(q || p) != E[k2].
  q = jnp.array([0.6, 0.3, 0.1])
  p = jnp.array([0.2, 0.5, 0.3])
  exact = float(jnp.sum(q * jnp.log(q / p)))
  mean = {n: float(jnp.sum(q * kl.kl_estimate(n, jnp.log(q), jnp.log(p))))
          for n in kl.KL_ESTIMATORS}
  np.testing.assert_allclose(mean["k1"], exact, rtol=1e-5)
  np.testing.assert_allclose(mean["k3"], exact, rtol=1e-5)
  assert abs(mean["k2"] - exact) > 0.05


def test_k1_as_loss_has_zero_expected_gradient_but_as_reward_gives_the_kl_gradient():
  p_logits = jnp.array([0.3, -0.2, 1.0])
  logp = jax.nn.log_softmax(p_logits)
  theta = jnp.array([1.0, 0.0, -0.5])

  def expected_over_samples(per_sample_loss):
    # E_{x~q}[grad L(x)] with q held at the sampling point: sum_x q(x) grad L(x).
    q = jax.lax.stop_gradient(jax.nn.softmax(theta))
    return jax.grad(lambda t: jnp.sum(q * per_sample_loss(jax.nn.log_softmax(t))))(theta)

  k1_loss_grad = expected_over_samples(lambda logq: kl.k1(logp - logq))
  np.testing.assert_allclose(np.asarray(k1_loss_grad), 0.0, atol=1e-6)
  k3_loss_grad = expected_over_samples(lambda logq: kl.k3(logp - logq))
  assert np.abs(np.asarray(k3_loss_grad)).max() > 1e-2

  # Reward placement: REINFORCE with reward -k1 (detached) gives -grad KL(q || p).
  def reinforce(logq):
    penalty = jax.lax.stop_gradient(kl.k1(logp - logq))
    return penalty * logq
  true_grad = jax.grad(
      lambda t: jnp.sum(jax.nn.softmax(t) * (jax.nn.log_softmax(t) - logp)))(theta)
  np.testing.assert_allclose(np.asarray(expected_over_samples(reinforce)),
                             np.asarray(true_grad), rtol=1e-5, atol=1e-6)


def test_penalty_to_go_sums_future_masked_tokens():
  kl_BxL = jnp.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
  mask_BxL = jnp.array([[0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
  np.testing.assert_allclose(np.asarray(kl.kl_penalty_to_go(kl_BxL, mask_BxL)),
                             [[9, 9, 7, 4], [11, 6, 0, 0]])


def test_unknown_estimator():
  with pytest.raises(ValueError, match="k1"):
    kl.kl_estimate("k4", 0.0, 0.0)
