"""The concave length penalty of the Composer 2 report (§4).

  C(x; k, q) = ((1 + k x)^(1 - q) - 1) / (k (1 - q))

C(0) = 0 and C'(x) = (1 + k x)^(-q), so the slope is 1 at x = 0 and decays with x for
q > 0: each extra token costs less the longer a rollout already is. q = 0 is the linear
penalty C = x; q = 1 is the limit log(1 + k x) / k.

Stable form. With u = log1p(k x) and a = 1 - q, C = expm1(a u) / (a k) = (u / k) *
exprel(a u), where exprel(z) = expm1(z) / z -> 1 as z -> 0. `_exprel` switches to its
Taylor series near z = 0, so values and gradients (in x, k and q) are finite and smooth
through q = 1 instead of dividing 0 by 0.
"""

from __future__ import annotations

import numbers

import jax.numpy as jnp

# Below this |z| the 4-term series of exprel is exact to ~z^4 / 120 < 1e-10 (relative).
_SERIES_BELOW = 1e-2


def _exprel(z):
  """expm1(z) / z, with the z -> 0 limit 1; both branches are safe so gradients are too."""
  small = jnp.abs(z) < _SERIES_BELOW
  safe_z = jnp.where(small, 1.0, z)
  series = 1.0 + z / 2.0 + z * z / 6.0 + z * z * z / 24.0
  return jnp.where(small, series, jnp.expm1(safe_z) / safe_z)


def _check(name: str, value, lower: float, strict: bool) -> None:
  # Only concrete Python numbers can be checked; arrays and tracers pass through.
  if isinstance(value, numbers.Real):
    bad = value <= lower if strict else value < lower
    if bad:
      bound = f"> {lower}" if strict else f">= {lower}"
      raise ValueError(f"length_penalty: {name} = {value!r} must be {bound} "
                       "(set it in config.rl.reward.length_penalty).")


def length_penalty(x, k, q):
  """C(x; k, q), elementwise with broadcasting over x, k and q.

  x: the (weighted) length, >= 0 (defined for x > -1/k). k > 0 sets where the curve
  starts to bend (around x ~ 1/k); q >= 0 sets how strongly it bends.
  Returns a float array (float32 unless the inputs are float64 under x64).
  """
  _check("k", k, 0.0, strict=True)
  _check("q", q, 0.0, strict=False)
  x = jnp.asarray(x)
  dtype = jnp.promote_types(x.dtype, jnp.float32)
  x, k, q = (jnp.asarray(v, dtype) for v in (x, k, q))
  u = jnp.log1p(k * x)
  return (u / k) * _exprel((1.0 - q) * u)
