"""Placing the rollout engine on a mesh of local devices, by the training logical rules.

A `parallel` config (the same section pretraining and the RL learner take: mesh axis
sizes + logical-axis rules) says how the engine's arrays map to devices:
  parameters   by their logical axis names (model.param_axes): 'embed' over fsdp,
               'expert' over expert, 'heads' / 'mlp' / 'vocab' over tensor, ...;
  KV cache     [layers, slots, cache_length, ...] by model.cache_axes: the slot dimension
               is the logical 'batch', so slots split over the data-like axes (data,
               fsdp, expert by the default rules) and each device holds whole sequences;
  MTP state    the speculative drafter's cache and last hidden states, alike by slot.
Activations follow the model's own logical constraints while the engine's programs trace
inside `Placement.scope()`, and MoE layers use expert parallelism (all-to-all) whenever
'expert' maps to a mesh axis larger than 1, as in training.

The engine mesh spans this process's devices, or, in a job of several JAX processes
(jax.distributed; c2jax.parallel.distributed), every process's: with an axis of -1, all
of them; otherwise the first prod(sizes) in jax.devices() order. Over several processes
process 0 schedules and the others follow it program by program (lockstep.py). A mesh of
one device is no mesh at all: the engine then runs exactly as without `parallel`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import flax.linen as nn
import jax
import ml_collections
from jax.sharding import PartitionSpec as P

from c2jax import config as configlib
from c2jax import model
from c2jax import parallel as parallel_lib
from c2jax.parallel import mesh as mesh_lib
from c2jax.rollout import resident
from c2jax_kernels import weight_quant

_SPEC = lambda x: isinstance(x, P)
# Axes an engine mesh over several processes or slices may spread across them, in order:
# the slots' data-like axes, then the experts (wide expert parallelism, as inference
# engines run it across nodes; every other axis stays inside a process).
ENGINE_DCN_AXES = ("data", "fsdp", "expert")


def engine_devices(mesh_cfg, devices=None) -> list:
  """The devices an engine mesh of `mesh_cfg` uses (see the module docstring)."""
  spread = devices is None and jax.process_count() > 1
  if devices is None:
    devices = jax.devices() if spread else jax.local_devices()
  devices = list(devices)
  sizes = [int(mesh_cfg[axis]) for axis in mesh_lib.MESH_AXES]
  if -1 in sizes:
    return devices
  wanted = math.prod(sizes)
  if wanted > len(devices):
    raise configlib.ConfigError(
        "parallel.mesh", f"asks for {wanted} devices ({dict(zip(mesh_lib.MESH_AXES, sizes))}) "
        f"but {'this job' if jax.process_count() > 1 else 'this process'} has "
        f"{len(devices)}; shrink the mesh or set one axis to -1.")
  chosen = devices[:wanted]
  owners = {device.process_index for device in chosen}
  if spread and len(owners) < jax.process_count():
    raise configlib.ConfigError(
        "parallel.mesh", f"asks for {wanted} of the job's {len(devices)} devices, which "
        f"belong to processes {sorted(owners)} only; every process of a jax.distributed "
        f"job runs the engine, so its mesh must take devices of all "
        f"{jax.process_count()} processes (set one axis to -1, or start fewer processes).")
  return chosen


@dataclasses.dataclass(frozen=True)
class Placement:
  """The mesh and logical rules of one engine, and the shardings they give its arrays."""
  mesh: jax.sharding.Mesh
  rules: tuple

  @contextlib.contextmanager
  def scope(self):
    """Mesh + rules in force while the engine's programs trace and run."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield

  def shardings(self, logical_specs):
    """NamedShardings for a tree of logical PartitionSpecs."""
    return nn.logical_to_mesh_sharding(logical_specs, self.mesh, self.rules)

  @property
  def replicated(self) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(self.mesh, P())

  def param_shardings(self, cfg, params):
    """Shardings for `params` (model.init's tree, 'mtp_layers' included or not); a leaf
    the model does not declare (none today) is replicated rather than guessed."""
    declared = {path: spec for path, spec in jax.tree_util.tree_leaves_with_path(
        model.param_axes(cfg), is_leaf=_SPEC)}
    specs = jax.tree_util.tree_map_with_path(
        lambda path, leaf: declared.get(path, P()), params, is_leaf=weight_quant.is_quantized)
    shardings = self.shardings(specs)

    def held(leaf, sharding):
      # Experts held quantised (resident.quantize_resident): values as their weight,
      # scales likewise where their blocked dimensions divide.
      if not weight_quant.is_quantized(leaf):
        return sharding
      return weight_quant.WeightQuant(
          sharding, resident.scale_sharding(sharding, leaf.shape, leaf.block), leaf.scheme,
          leaf.block)
    return jax.tree.map(held, params, shardings, is_leaf=weight_quant.is_quantized)

  def cache_shardings(self, cfg):
    return self.shardings(jax.tree.map(lambda axes: P(*axes), model.cache_axes(cfg),
                                       is_leaf=lambda x: isinstance(x, tuple)))

  def mtp_cache_shardings(self, cfg):
    """One MTP depth's cache: the stacked layer cache's axes without 'layers'."""
    from c2jax.model import attention  # pylint: disable=g-import-not-at-top

    return self.shardings({name: P(*axes[1:])
                           for name, axes in attention.layer_cache_axes(cfg).items()})

  def hidden_sharding(self):
    """Per-slot hidden states [S, H] (the drafter's input)."""
    return self.shardings(P("batch", "embed"))

  def slot_ways(self) -> int:
    """How many ways the slot (logical 'batch') dimension is split."""
    return _slot_ways(dict(self.mesh.shape), self.rules)


def engine_parallel_defaults() -> ml_collections.ConfigDict:
  """An engine's `parallel` section: mesh axis sizes (all 1: one device) and the
  logical-axis rules, the training defaults. Jobs that build engines embed it (e.g.
  config.actors.parallel) and users set mesh sizes, e.g. actors.parallel.mesh.fsdp=8."""
  c = ml_collections.ConfigDict()
  c.mesh = ml_collections.ConfigDict({axis: 1 for axis in mesh_lib.MESH_AXES})
  c.rules = parallel_lib.DEFAULT_RULES
  return c


def parse_mesh(spec: str) -> ml_collections.ConfigDict:
  """An engine `parallel` section from 'axis=size,...' (e.g. 'fsdp=4,tensor=2'; '-1'
  absorbs the remaining local devices); the `c2jax serve --mesh` syntax."""
  c = engine_parallel_defaults()
  for item in filter(None, (part.strip() for part in spec.split(","))):
    axis, _, size = item.partition("=")
    axis = axis.strip()
    if axis not in mesh_lib.MESH_AXES or not size.strip().lstrip("-").isdigit():
      raise ValueError(f"mesh {spec!r}: {item!r} is not axis=size with an axis of "
                       f"{mesh_lib.MESH_AXES}; e.g. 'fsdp=4,tensor=2'.")
    c.mesh[axis] = int(size)
  return c


def check_config(parallel_cfg, num_slots: int, prefix: str = "parallel.") -> None:
  """Validates an engine `parallel` section before anything is placed or compiled:
  known keys, rules, axis sizes, no context parallelism (a decode step has one token
  per slot: nothing to split along the sequence), and slots that split evenly over the
  axes the slot dimension maps to (when the sizes are fixed)."""
  configlib.check_keys(parallel_cfg, parallel_lib.default_parallel_config(), prefix)
  try:
    parallel_lib.validate_parallel(parallel_cfg)
  except configlib.ConfigError as e:  # name the key where this section really lives
    raise configlib.ConfigError(prefix + e.key.removeprefix("parallel."),
                                str(e).split(": ", 1)[1]) from None
  if int(parallel_cfg.mesh.context) != 1:
    raise configlib.ConfigError(
        f"{prefix}mesh.context", f"is {parallel_cfg.mesh.context}; the rollout engine does "
        "not split sequences (decode feeds one token per slot). Use 1 and give the devices "
        "to fsdp, expert or tensor.")
  sizes = {axis: int(parallel_cfg.mesh[axis]) for axis in mesh_lib.MESH_AXES}
  if -1 not in sizes.values():
    ways = _slot_ways(sizes, parallel_lib.rules_of(parallel_cfg))
    if num_slots % ways:
      raise configlib.ConfigError(
          f"{prefix}mesh", f"splits the engine's slots {ways} ways (the axes the 'batch' "
          f"rule maps to, sizes {sizes}) but there are {num_slots} slots; use a multiple "
          f"of {ways} slots, or move devices to the tensor axis.")


def _slot_ways(sizes: dict[str, int], rules) -> int:
  """How many ways the slot (logical 'batch') dimension is split."""
  entry = nn.logical_to_mesh_axes(("batch",), rules)[0]
  axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
  return math.prod(sizes[axis] for axis in axes)


def placement_from_config(parallel_cfg, num_slots: int, devices=None,
                          prefix: str = "parallel.") -> Placement | None:
  """The engine's Placement for a `parallel` section, or None for one device (or no
  section). Raises ConfigError naming the key for a mesh this process cannot build."""
  if parallel_cfg is None:
    return None
  check_config(parallel_cfg, num_slots, prefix)
  try:
    devices = engine_devices(parallel_cfg.mesh, devices)
    mesh_lib.mesh_shape(parallel_cfg.mesh, len(devices))
  except configlib.ConfigError as e:
    raise configlib.ConfigError(prefix + e.key.removeprefix("parallel."),
                                str(e).split(": ", 1)[1]) from None
  if len(devices) == 1:
    return None
  placement = Placement(parallel_lib.make_mesh(parallel_cfg.mesh, devices, ENGINE_DCN_AXES),
                        parallel_lib.rules_of(parallel_cfg))
  # With an axis of -1 the sizes are only known now.
  check_config(_resolved(parallel_cfg, placement.mesh), num_slots, prefix)
  return placement


def _resolved(parallel_cfg, mesh) -> ml_collections.ConfigDict:
  resolved = parallel_cfg.copy_and_resolve_references()
  resolved.mesh.update(dict(mesh.shape))
  return resolved
