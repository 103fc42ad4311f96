"""length_penalty: hand-derived values, the q = 0 and q = 1 cases, shape and gradients."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import rl
from c2jax.rl import length_penalty


def _reference64(x, k, q):
  """The formula as written, in float64 (log limit at q == 1)."""
  x, k, q = np.float64(x), np.float64(k), np.float64(q)
  if q == 1.0:
    return np.log1p(k * x) / k
  return ((1 + k * x) ** (1 - q) - 1) / (k * (1 - q))


def test_exported_from_package():
  assert rl.length_penalty is length_penalty


@pytest.mark.parametrize("x, k, q, expected", [
    (3.0, 1.0, 0.5, 2.0),                        # (sqrt(4) - 1) / 0.5
    (2.0, 0.5, 2.0, 1.0),                        # (2^-1 - 1) / (0.5 * -1)
    ((math.e - 1) / 2, 2.0, 1.0, 0.5),           # log(e) / 2
    (8.0, 1.0, 2.0 / 3.0, 3.0 * (9 ** (1 / 3) - 1)),
])
def test_hand_values(x, k, q, expected):
  np.testing.assert_allclose(float(length_penalty(x, k, q)), expected, rtol=1e-6)


@pytest.mark.parametrize("k, q", [(1.0, 0.0), (1e-3, 0.5), (2.0, 1.0), (0.1, 3.0)])
def test_zero_at_zero_with_unit_slope(k, q):
  assert float(length_penalty(0.0, k, q)) == 0.0
  slope = jax.grad(lambda x: length_penalty(x, k, q))(0.0)
  np.testing.assert_allclose(float(slope), 1.0, rtol=1e-6)


def test_q_zero_is_linear():
  x = jnp.array([0.0, 1.0, 17.0, 1e4])
  for k in (1e-4, 1.0, 50.0):
    np.testing.assert_allclose(np.asarray(length_penalty(x, k, 0.0)), np.asarray(x),
                               rtol=1e-6)


def test_concave_and_increasing_for_positive_q():
  # C'(x) = (1 + kx)^-q, C''(x) = -q k (1 + kx)^(-q-1): at k=1, q=.5, x=3 that is 1/2, -1/16.
  first = jax.grad(lambda x: length_penalty(x, 1.0, 0.5))
  second = jax.grad(first)
  np.testing.assert_allclose(float(first(3.0)), 0.5, rtol=1e-6)
  np.testing.assert_allclose(float(second(3.0)), -0.0625, rtol=1e-5)
  x = jnp.linspace(0.0, 100.0, 101)
  for q in (0.3, 1.0, 2.5):
    c = np.asarray(length_penalty(x, 0.2, q))
    assert np.all(np.diff(c) > 0)
    assert np.all(np.diff(c, 2) < 0)
    assert np.all(c <= np.asarray(x) + 1e-4)  # concave through 0 with slope 1: below x


def test_q_one_is_the_log_limit_and_continuous_around_it():
  x, k = 250.0, 0.03
  limit = math.log1p(k * x) / k
  np.testing.assert_allclose(float(length_penalty(x, k, 1.0)), limit, rtol=1e-6)
  # Straddle the series switch (|(1 - q) u| = 1e-2 at 1 - q ~ 4.8e-3 here).
  for q in (1 - 1e-1, 1 - 5e-3, 1 - 4.7e-3, 1 - 1e-4, 1 - 1e-7, 1 + 1e-7, 1 + 4.9e-3,
            1 + 2e-2):
    np.testing.assert_allclose(float(length_penalty(x, k, q)), _reference64(x, k, q),
                               rtol=2e-6)


def test_elementwise_broadcasting():
  x = jnp.array([0.0, 1.0, 3.0])
  q = jnp.array([[0.0], [0.5], [1.0]])
  out = np.asarray(length_penalty(x, 1.0, q))
  assert out.shape == (3, 3)
  expected = [[_reference64(xi, 1.0, qi) for xi in (0.0, 1.0, 3.0)] for qi in (0.0, 0.5, 1.0)]
  np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_gradients_finite_in_x_k_and_q_at_and_near_one():
  grads = jax.grad(length_penalty, argnums=(0, 1, 2))
  for q in (1.0, 1 - 1e-6, 1 + 1e-3, 0.0, 4.0):
    assert all(np.isfinite(float(g)) for g in grads(2.0, 0.7, q))
  # dC/dq at q = 1 is -u^2 / (2k), u = log1p(kx): u = 1 at k = 1, x = e - 1.
  np.testing.assert_allclose(float(grads(math.e - 1, 1.0, 1.0)[2]), -0.5, rtol=1e-5)


def test_jit_and_integer_inputs():
  f = jax.jit(length_penalty)
  np.testing.assert_allclose(float(f(3.0, 1.0, 0.5)), 2.0, rtol=1e-6)
  assert length_penalty(np.arange(3, dtype=np.int32), 1.0, 0.5).dtype == jnp.float32


@pytest.mark.parametrize("k, q", [(0.0, 0.5), (-1.0, 0.5), (1.0, -0.1)])
def test_rejects_bad_k_and_q(k, q):
  with pytest.raises(ValueError, match="must be"):
    length_penalty(1.0, k, q)
