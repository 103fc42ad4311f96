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

The engine mesh spans this process's devices only (an actor or a server is one process):
with an axis of -1, all local devices; otherwise the first prod(sizes) of them. A mesh of
one device is no mesh at all: the engine then runs exactly as without `parallel`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec as P

from c2jax import config as configlib
from c2jax import model
from c2jax import parallel as parallel_lib
from c2jax.parallel import mesh as mesh_lib

_SPEC = lambda x: isinstance(x, P)


def engine_devices(mesh_cfg, devices=None) -> list:
  """The local devices an engine mesh of `mesh_cfg` uses (see the module docstring)."""
  devices = list(jax.local_devices() if devices is None else devices)
  sizes = [int(mesh_cfg[axis]) for axis in mesh_lib.MESH_AXES]
  if -1 in sizes:
    return devices
  wanted = math.prod(sizes)
  if wanted > len(devices):
    raise configlib.ConfigError(
        "parallel.mesh", f"asks for {wanted} devices ({dict(zip(mesh_lib.MESH_AXES, sizes))}) "
        f"but this process has {len(devices)}; shrink the mesh or set one axis to -1.")
  return devices[:wanted]


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
        lambda path, leaf: declared.get(path, P()), params)
    return self.shardings(specs)

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
    entry = nn.logical_to_mesh_axes(("batch",), self.rules)[0]
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    return math.prod(self.mesh.shape[axis] for axis in axes)


def placement_from_config(parallel_cfg, num_slots: int, devices=None) -> Placement | None:
  """The engine's Placement for a `parallel` config, or None when it spans one device.

  Validates the section as training does, and that the slots split evenly over the
  devices the slot dimension is sharded across.
  """
  if parallel_cfg is None:
    return None
  parallel_lib.validate_parallel(parallel_cfg)
  devices = engine_devices(parallel_cfg.mesh, devices)
  mesh_lib.mesh_shape(parallel_cfg.mesh, len(devices))
  if len(devices) == 1:
    return None
  placement = Placement(parallel_lib.make_mesh(parallel_cfg.mesh, devices),
                        parallel_lib.rules_of(parallel_cfg))
  ways = placement.slot_ways()
  if num_slots % ways:
    raise configlib.ConfigError(
        "parallel.mesh", f"splits the engine's slots {ways} ways (the axes the 'batch' rule "
        f"maps to, sizes {dict(placement.mesh.shape)}) but num_slots = {num_slots}; use a "
        f"multiple of {ways} slots, or move devices to the tensor axis.")
  return placement
