"""Device meshes from config: named axes whose sizes may be -1 (absorb the remaining devices).

Axes, outermost first: data (pure data parallel), fsdp (data parallel with sharded
parameters), expert (expert parallel), context (sequence parallel), tensor.

Across hosts or slices the mesh is hybrid: the slow network (between slices, or between
processes off TPU, whose hosts in one slice share the ICI torus) is spanned by the outer, data-like axes
(data, then fsdp), whose collectives are the least frequent, so expert/context/tensor
traffic stays on the fast network inside each granule (`dcn_shape`).
"""

from __future__ import annotations

import math

import jax
import ml_collections
import numpy as np
from jax.experimental import mesh_utils

from c2jax import config as configlib
from c2jax.parallel import distributed

MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")


def default_parallel_config() -> ml_collections.ConfigDict:
  from c2jax.parallel.rules import DEFAULT_RULES

  c = ml_collections.ConfigDict()
  c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "expert": 1, "context": 1,
                                      "tensor": 1})
  c.rules = DEFAULT_RULES
  c.distributed = distributed.distributed_defaults()
  # With context parallelism (the 'length' rule's axes > 1), the loop permutes each batch
  # along the sequence so every context shard does equal causal attention work; False
  # keeps contiguous shards. See c2jax.parallel.context.
  c.context_load_balance = True
  return c


def mesh_shape(mesh_cfg, num_devices: int) -> dict[str, int]:
  """Axis sizes with at most one -1 resolved so the product is `num_devices`."""
  sizes = {axis: int(mesh_cfg[axis]) for axis in MESH_AXES}
  free = [axis for axis, size in sizes.items() if size == -1]
  if len(free) > 1:
    raise configlib.ConfigError(f"parallel.mesh.{free[1]}",
                                f"only one axis may be -1, got {free}.")
  for axis, size in sizes.items():
    if size == 0 or size < -1:
      raise configlib.ConfigError(f"parallel.mesh.{axis}", f"is {size}; use >= 1 or -1.")
  fixed = math.prod(size for size in sizes.values() if size != -1)
  if free:
    if num_devices % fixed:
      raise configlib.ConfigError(
          f"parallel.mesh.{free[0]}",
          f"cannot absorb {num_devices} devices: the other axes multiply to {fixed}.")
    sizes[free[0]] = num_devices // fixed
  elif fixed != num_devices:
    raise configlib.ConfigError(
        "parallel.mesh", f"axes {sizes} use {fixed} devices but {num_devices} are present; "
        "set one axis to -1 or fix the sizes.")
  return sizes


# Axes the slow (cross-granule) network may span, in the order they absorb granules.
DCN_AXES = ("data", "fsdp")


def dcn_shape(sizes: dict[str, int], num_granules: int,
              dcn_axes: tuple[str, ...] = DCN_AXES) -> dict[str, int]:
  """How many granules (slices or processes) each mesh axis spans: `dcn_axes` in order
  (training: data first, then fsdp).

  Every other axis stays inside a granule. Raises ConfigError when those axes cannot
  absorb `num_granules`.
  """
  spans = {axis: 1 for axis in MESH_AXES}
  left = num_granules
  for axis in dcn_axes:
    spans[axis] = math.gcd(left, sizes[axis])
    left //= spans[axis]
  if left != 1:
    raise configlib.ConfigError(
        "parallel.mesh", f"{num_granules} hosts/slices must split over the axes that may "
        f"span them, {dcn_axes} (the data-like ones; an engine's experts too; sizes "
        f"{[sizes[a] for a in dcn_axes]}), whose product must be a "
        f"multiple of them; enlarge {' or '.join(dcn_axes)}.")
  return spans


def num_granules(devices) -> tuple[int, bool]:
  """(slices or processes the devices belong to, whether the granule is the process).

  TPU hosts of one slice share its ICI torus, so only slices are granules there; on other
  platforms (GPU nodes, CPU processes) each process is one."""
  slices = {getattr(device, "slice_index", 0) for device in devices}
  if len(slices) > 1:
    return len(slices), False
  if devices[0].platform == "tpu":
    return 1, False
  return len({device.process_index for device in devices}), True


def make_mesh(mesh_cfg, devices=None,
              dcn_axes: tuple[str, ...] = DCN_AXES) -> jax.sharding.Mesh:
  """The mesh of `mesh_cfg` over `devices` (default all); across slices or processes,
  `dcn_axes` span them (dcn_shape) and the other axes stay inside each."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = mesh_shape(mesh_cfg, len(devices))
  granules, by_process = num_granules(devices)
  if granules > 1:
    spans = dcn_shape(sizes, granules, dcn_axes)
    inner = tuple(sizes[axis] // spans[axis] for axis in MESH_AXES)
    device_array = mesh_utils.create_hybrid_device_mesh(
        inner, tuple(spans[axis] for axis in MESH_AXES), devices,
        process_is_granule=by_process)
    return jax.sharding.Mesh(device_array, MESH_AXES)
  shape = tuple(sizes[axis] for axis in MESH_AXES)
  try:
    device_array = mesh_utils.create_device_mesh(shape, devices)
  except (AssertionError, NotImplementedError, ValueError):
    device_array = np.asarray(devices).reshape(shape)
  return jax.sharding.Mesh(device_array, MESH_AXES)


def validate_parallel(parallel_cfg, num_devices: int | None = None) -> None:
  """Checks keys, rules and axis sizes; with `num_devices`, also that the mesh fits them."""
  configlib.check_keys(parallel_cfg, default_parallel_config(), "parallel.")
  if "distributed" in parallel_cfg:
    distributed.validate(parallel_cfg.distributed)
  fixed = math.prod(size for size in parallel_cfg.mesh.values() if size != -1)
  mesh_shape(parallel_cfg.mesh, fixed if num_devices is None else num_devices)
  for i, rule in enumerate(parallel_cfg.rules):
    if len(rule) != 2 or not isinstance(rule[0], str):
      raise configlib.ConfigError(f"parallel.rules[{i}]",
                                  f"is {rule!r}; expected (logical_name, mesh_axes).")
    targets = rule[1] if isinstance(rule[1], (tuple, list)) else (rule[1],)
    for target in targets:
      if target is not None and target not in MESH_AXES:
        raise configlib.ConfigError(f"parallel.rules[{i}]",
                                    f"maps to unknown mesh axis {target!r}; use {MESH_AXES}.")
