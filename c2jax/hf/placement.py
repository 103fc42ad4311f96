"""Parameters streamed from a source straight into their device shards.

    params = placement.place(source, abstract_params, shardings)

For each leaf, each distinct shard (per `sharding.addressable_devices_indices_map`) is
read from the source on its own (sources.py reads only what overlaps it), cast to the
run's parameter dtype, put on every device that holds that shard, and released before the
next one is read; the leaf is then assembled with `make_array_from_single_device_arrays`.
The host holds one shard (plus the HF tensor it was cut from) at a time, and a large shard
of stacked tensors is written into its device buffer in blocks, so never a whole leaf or
the model: that is what lets a host load a model larger than its RAM when the
mesh spreads it over many devices. Replicated shards are read once and copied per device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.hf import names


def _key(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple:
  return tuple(s.indices(n) for s, n in zip(index, shape))


# A shard larger than this is assembled on its device block by block (see place_leaf).
BLOCK_BYTES = 64 * 2**20


@functools.partial(jax.jit, donate_argnums=0)
def _write_rows(buffer, rows, start):
  return jax.lax.dynamic_update_slice_in_dim(buffer, rows, start, 0)


def place_leaf(read: Callable[[tuple[slice, ...]], np.ndarray], shape: tuple[int, ...],
               dtype, sharding: jax.sharding.Sharding, stacked_dims: int = 0) -> jax.Array:
  """One leaf, shard by shard: `read(index)` returns leaf[index] in any float dtype.

  `stacked_dims` leading axes are stacks of separately stored tensors (layers, experts):
  a shard over BLOCK_BYTES is then read one block of rows along the first axis at a time
  and written into a buffer already on its device (a donated in-place update), so the
  host never holds more than a block even when one device holds a whole leaf.
  """
  shape = tuple(shape)
  groups: dict[tuple, tuple[tuple[slice, ...], list]] = {}
  for device, index in sharding.addressable_devices_indices_map(shape).items():
    index = tuple(index) + (slice(None),) * (len(shape) - len(tuple(index)))
    groups.setdefault(_key(index, shape), (index, []))[1].append(device)
  buffers = []
  for index, devices in groups.values():
    ranges = [range(*s.indices(n)) for s, n in zip(index, shape)]
    expected = tuple(len(r) for r in ranges)
    nbytes = int(np.prod(expected)) * np.dtype(dtype).itemsize
    if not stacked_dims or nbytes <= BLOCK_BYTES or expected[0] < 2:
      host = _checked(read(index), dtype, expected)
      buffers += [jax.device_put(host, device) for device in devices]
      del host
      continue
    rows = max(1, BLOCK_BYTES * expected[0] // nbytes)
    on_device = [jnp.zeros(expected, dtype, device=device) for device in devices]
    first = ranges[0]
    for begin in range(0, len(first), rows):
      block = range(first[begin], first[min(begin + rows, len(first)) - 1] + 1)
      sub = (slice(block.start, block.stop),) + tuple(index[1:])
      host = _checked(read(sub), dtype, (len(block),) + expected[1:])
      on_device = [_on_one_device(buf, host, begin) for buf in on_device]
      del host
    buffers += on_device
  return jax.make_array_from_single_device_arrays(shape, sharding, buffers)


def _on_one_device(buffer: jax.Array, rows: np.ndarray, start: int) -> jax.Array:
  """buffer[start:start + len(rows)] = rows, in place, on buffer's device; under a mesh of
  that device alone, since callers may have the run's whole mesh set."""
  (device,) = buffer.devices()
  set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
  with set_mesh(jax.sharding.Mesh(np.array([device]), ("block",))):
    return _write_rows(buffer, jax.device_put(rows, device), start)


def _checked(array, dtype, expected: tuple[int, ...]) -> np.ndarray:
  host = np.asarray(array).astype(dtype, copy=False)
  if host.shape != expected:
    raise ValueError(f"a source returned shape {host.shape} for a shard of shape "
                     f"{expected}; the source and the model disagree.")
  return host


def place(source, abstract_params: dict, shardings: dict | None = None) -> dict:
  """`abstract_params` (a nested dict of ShapeDtypeStructs, e.g. from jax.eval_shape)
  filled from `source` (sources.HFSource / ConvertedSource), placed per `shardings` (a
  tree like it; None puts every leaf whole on the default device)."""
  default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  flat = jax.tree_util.tree_leaves_with_path(abstract_params)
  flat_shardings = ([default] * len(flat) if shardings is None
                    else jax.tree_util.tree_leaves(shardings))
  if len(flat_shardings) != len(flat):
    raise ValueError("shardings do not match the parameter tree.")
  placed = []
  for (path, leaf), sharding in zip(flat, flat_shardings):
    keys: names.Path = tuple(k.key for k in path)
    placed.append(place_leaf(lambda index, keys=keys: source.read(keys, index), leaf.shape,
                             leaf.dtype, sharding, source.stacked_dims(keys)))
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(abstract_params), placed)
