"""Parameters streamed from a source straight into their device shards.

    params = placement.place(source, abstract_params, shardings)

For each leaf, each distinct shard (per `sharding.addressable_devices_indices_map`) is
read from the source on its own (sources.py reads only what overlaps it), cast to the
run's parameter dtype, put on every device that holds that shard, and released before the
next one is read; the leaf is then assembled with `make_array_from_single_device_arrays`.
The host holds one shard (plus the HF tensor it was cut from) at a time, never a whole
leaf or the model: that is what lets a host load a model larger than its RAM when the
mesh spreads it over many devices. Replicated shards are read once and copied per device.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from c2jax.hf import names


def _key(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple:
  return tuple(s.indices(n) for s, n in zip(index, shape))


def place_leaf(read: Callable[[tuple[slice, ...]], np.ndarray], shape: tuple[int, ...],
               dtype, sharding: jax.sharding.Sharding) -> jax.Array:
  """One leaf, shard by shard: `read(index)` returns leaf[index] in any float dtype."""
  shape = tuple(shape)
  groups: dict[tuple, tuple[tuple[slice, ...], list]] = {}
  for device, index in sharding.addressable_devices_indices_map(shape).items():
    index = tuple(index) + (slice(None),) * (len(shape) - len(tuple(index)))
    groups.setdefault(_key(index, shape), (index, []))[1].append(device)
  buffers = []
  for index, devices in groups.values():
    host = np.asarray(read(index)).astype(dtype, copy=False)
    expected = tuple(len(range(*s.indices(n))) for s, n in zip(index, shape))
    if host.shape != expected:
      raise ValueError(f"a source returned shape {host.shape} for a shard of shape "
                       f"{expected}; the source and the model disagree.")
    buffers += [jax.device_put(host, device) for device in devices]
    del host
  return jax.make_array_from_single_device_arrays(shape, sharding, buffers)


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
                             leaf.dtype, sharding))
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(abstract_params), placed)
