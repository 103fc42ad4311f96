"""The shared training runtime's host-side pieces: metrics read one step late, the NaN
check naming the step, and the batch ways of a mesh."""

import jax.numpy as jnp
import pytest

from c2jax import parallel
from c2jax.train import runtime


def test_metrics_are_reported_one_step_late_and_flushed_on_demand():
  rows = []
  late = runtime.LateMetrics(lambda step, metrics, extra: rows.append((step, metrics, extra))
                             or {"step": step, **metrics})
  late.push(1, {"loss": jnp.float32(2.0)}, "a")
  assert rows == []  # step 1 waits until step 2 is dispatched
  late.push(2, {"loss": jnp.float32(1.5)}, "b")
  assert rows == [(1, {"loss": 2.0}, "a")]
  assert late.flush() == {"step": 2, "loss": 1.5}
  assert late.flush() is None  # nothing pending
  assert [r[0] for r in rows] == [1, 2] and late.last["loss"] == 1.5


def test_a_non_finite_loss_stops_naming_its_step_before_it_is_reported():
  rows = []
  late = runtime.LateMetrics(lambda step, metrics, extra: rows.append(step) or {},
                             lambda step: f"last good checkpoint: {step - 1}")
  late.push(1, {"loss": jnp.float32(0.5)})
  late.push(2, {"loss": jnp.float32(jnp.nan)})
  with pytest.raises(runtime.NonFiniteLossError, match=r"nan at step 2; stopping\. last "
                     r"good checkpoint: 1"):
    late.push(3, {"loss": jnp.float32(0.1)})
  assert rows == [1]


def test_batch_ways_follow_the_batch_rule():
  rules = parallel.rules_of(parallel.default_parallel_config())
  sizes = {"data": 2, "fsdp": 2, "expert": 2, "context": 4, "tensor": 1}
  assert runtime.batch_ways(sizes, rules) == 8  # data x fsdp x expert; context splits L
  assert runtime.batch_ways(sizes, (("length", "context"),)) == 1
