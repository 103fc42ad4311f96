"""Gradient accumulation: one optimizer step over N sequential microbatches.

    (loss, metrics), grads = accumulate.value_and_grad(fn, params, batch, microbatches)

`fn(microbatch) -> ((loss, metrics), grads)` is the step's own value-and-grad of one
microbatch. With N = 1 it is called once on the whole batch; with N > 1 a `lax.scan` runs
it on N microbatches of B / N rows each, one after another, so only one microbatch's
activations are alive at a time, and sums the gradients in an accumulator of the
parameters' own dtypes (fp32 masters under the mixed-precision policy).

Summing is exact when every loss term divides by the WHOLE batch's count (tokens, rows,
positions per MTP depth), not the microbatch's: the callers compute those totals from the
batch before the scan and pass them in (c2jax.train.step.batch_totals,
c2jax.rl.learner.step). Metrics are summed too (token counts, expert loads, loss terms
normalised that way), except the keys in `maxed`, which take the maximum, and the keys in
`stacked`, per-row arrays [B / N, ...] that are put back together into the batch's own
row order [B, ...] (for statistics that do not add up, such as a quantile over tokens).

Microbatch i takes rows i, i + N, i + 2N, ... so that, with the batch's rows sharded over
D data-parallel devices (B divisible by N * D), each device holds its own share of every
microbatch and the scan moves no rows between devices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp

from c2jax import config as configlib


def split(batch: dict, microbatches: int) -> dict:
  """[B, ...] fields -> [N, B / N, ...], microbatch i holding rows i, i + N, ..."""
  def one(x):
    rows = x.shape[0]
    if rows % microbatches:
      raise ValueError(f"accumulate.split: {rows} rows do not split into {microbatches} "
                       "microbatches; make the batch size a multiple of the microbatch "
                       "count (train.microbatches / learner.microbatches).")
    strided = x.reshape(rows // microbatches, microbatches, *x.shape[1:])
    return jnp.swapaxes(strided, 0, 1)
  return {key: one(value) for key, value in batch.items()}


def join(stacked_NxBm):
  """The inverse of `split` for one field: [N, B / N, ...] -> [B, ...] in batch order."""
  swapped = jnp.swapaxes(stacked_NxBm, 0, 1)
  return swapped.reshape(-1, *swapped.shape[2:])


def value_and_grad(fn: Callable, params, batch: dict, microbatches: int,
                   maxed: Iterable[str] = (), stacked: Iterable[str] = ()):
  """((loss, metrics), grads) of the whole batch from `fn` over `microbatches` slices."""
  if microbatches == 1:
    return fn(batch)
  maxed, stacked = frozenset(maxed), frozenset(stacked)
  micro = split(batch, microbatches)
  first = jax.tree.map(lambda x: x[0], micro)
  (loss_shape, metrics_shape), _ = jax.eval_shape(fn, first)
  missing = stacked - set(metrics_shape)
  if missing:
    raise ValueError(f"accumulate.value_and_grad: stacked={sorted(missing)} are not among "
                     f"the step's metrics {sorted(metrics_shape)}.")
  metrics_shape = {key: s for key, s in metrics_shape.items() if key not in stacked}

  def zeros(shape_tree):
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape_tree)

  def fill_for_max(key, s):
    if key not in maxed:
      return jnp.zeros(s.shape, s.dtype)
    low = -jnp.inf if jnp.issubdtype(s.dtype, jnp.floating) else jnp.iinfo(s.dtype).min
    return jnp.full(s.shape, low, s.dtype)

  init = (zeros(loss_shape),
          {key: fill_for_max(key, s) for key, s in metrics_shape.items()},
          jax.tree.map(jnp.zeros_like, params))

  def body(carry, microbatch):
    loss_sum, metrics_acc, grads_acc = carry
    (loss, metrics), grads = fn(microbatch)
    rows = {key: metrics[key] for key in stacked}
    metrics_acc = {key: (jnp.maximum(metrics_acc[key], value) if key in maxed
                         else metrics_acc[key] + value)
                   for key, value in metrics.items() if key not in stacked}
    grads_acc = jax.tree.map(lambda acc, g: acc + g.astype(acc.dtype), grads_acc, grads)
    return (loss_sum + loss, metrics_acc, grads_acc), rows

  (loss, metrics, grads), rows = jax.lax.scan(body, init, micro)
  metrics = {**metrics, **{key: join(value) for key, value in rows.items()}}
  return (loss, metrics), grads


def check_divisible(batch_rows: int, microbatches: int, batch_ways: int, key: str,
                    rows_key: str) -> None:
  """Raises ConfigError naming `key` unless `batch_rows` splits into `microbatches` slices
  that each divide over the `batch_ways` data-parallel devices."""
  if batch_rows % (microbatches * batch_ways):
    raise configlib.ConfigError(
        key, f"= {microbatches} must divide {rows_key} = {batch_rows} into microbatches "
        f"that each split over the {batch_ways} devices the 'batch' rule shards rows "
        f"over ({rows_key} must be a multiple of {microbatches} x {batch_ways}).")
