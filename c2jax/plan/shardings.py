"""Per-parameter sharding plans, computed from logical axes and a mesh shape only.

No devices are needed: the mesh is just axis sizes, so a 1T-parameter model's plan on a
thousand-chip mesh can be read on a laptop (`c2jax plan --shardings`).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import numpy as np

from c2jax import model
from c2jax.parallel import mesh as mesh_lib
from c2jax.parallel.rules import rules_of


@dataclasses.dataclass(frozen=True)
class ParamPlan:
  path: str
  shape: tuple[int, ...]
  dtype: str
  logical: tuple
  mesh_axes: tuple  # per dimension: None, an axis name or a tuple of names
  shard_shape: tuple[int, ...]
  uneven: bool  # some dimension does not divide by its mesh axes (XLA pads it)

  @property
  def shard_bytes(self) -> int:
    return math.prod(self.shard_shape) * np.dtype(self.dtype).itemsize


def _axes_size(axes, sizes: dict[str, int]) -> int:
  if axes is None:
    return 1
  names = axes if isinstance(axes, tuple) else (axes,)
  return math.prod(sizes[name] for name in names)


def param_plans(model_cfg, parallel_cfg, num_devices: int) -> list[ParamPlan]:
  """How every parameter of `model_cfg` is split over the mesh of `parallel_cfg`."""
  sizes = mesh_lib.mesh_shape(parallel_cfg.mesh, num_devices)
  rules = rules_of(parallel_cfg)
  shapes, logical = model.abstract_params(model_cfg)
  is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)
  plans = []
  for (path, spec), leaf in zip(
      jax.tree_util.tree_leaves_with_path(logical, is_leaf=is_spec),
      jax.tree_util.tree_leaves(shapes)):
    mesh_spec = tuple(nn.logical_to_mesh_axes(tuple(spec), rules))
    mesh_spec = mesh_spec + (None,) * (len(leaf.shape) - len(mesh_spec))
    ways = [_axes_size(axes, sizes) for axes in mesh_spec]
    plans.append(ParamPlan(
        path="/".join(str(getattr(k, "key", k)) for k in path), shape=tuple(leaf.shape),
        dtype=str(leaf.dtype), logical=tuple(spec), mesh_axes=mesh_spec,
        shard_shape=tuple(-(-d // w) for d, w in zip(leaf.shape, ways)),
        uneven=any(d % w for d, w in zip(leaf.shape, ways))))
  return plans


def summarize(plans: list[ParamPlan]) -> dict:
  total = sum(math.prod(p.shape) * np.dtype(p.dtype).itemsize for p in plans)
  per_device = sum(p.shard_bytes for p in plans)
  return {"parameters": len(plans), "param_bytes_total": total,
          "param_bytes_per_device": per_device,
          "param_gib_per_device": round(per_device / 2**30, 3),
          "uneven": [p.path for p in plans if p.uneven]}


def format_table(plans: list[ParamPlan]) -> str:
  def axes_text(axes):
    return "-" if axes is None else "+".join(axes) if isinstance(axes, tuple) else axes
  rows = [("parameter", "shape", "logical axes", "mesh axes", "per-device shard")]
  for p in plans:
    rows.append((p.path, "x".join(map(str, p.shape)),
                 ",".join(str(a) for a in p.logical),
                 ",".join(axes_text(a) for a in p.mesh_axes),
                 "x".join(map(str, p.shard_shape)) + (" (uneven)" if p.uneven else "")))
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                   for row in rows)
