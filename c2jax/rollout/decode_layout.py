"""How a JaxEngine keeps its weights and KV cache for decoding: one strategy per engine,
chosen by its platform and settings (`choose`), behind one interface:

  layout.to_layout(stacked_params) -> the tree the engine's programs read, from model.init's
      stacked tree (what update_params takes and param_like describes);
  layout.make_cache(cfg, num_slots, max_length) -> the zeroed KV cache they read;
  layout.forms -> {(inputs, outputs): form} of the projection kernels stored another way
      ({} when none), for reporting (JaxEngine.projection_forms).

STRATEGIES are asked in order, each by `choose(cfg, params, num_slots=, num_draft=,
placement=)`, which gives a layout or None where the strategy does not apply or pay;
StackedLayout takes the rest. Importing a strategy registers the kernel forms it stores
with the model (c2jax.model.projections), before any engine traces.
"""

from __future__ import annotations

from typing import Protocol

from c2jax import model
from c2jax.rollout.cpu_decode import CpuDecodeLayout


class DecodeLayout(Protocol):
  forms: dict

  def to_layout(self, stacked_params): ...

  def make_cache(self, cfg, num_slots: int, max_length: int): ...


class StackedLayout:
  """model.init's stacked tree and init_cache's stacked cache, as they are: meshes (the
  sharding rules name the stacked tree; expert parallelism needs stacked experts),
  accelerators (whose compilers read a layer's slice of a stack in place and whose
  grouped matmuls want stacked experts), and CPU engines where no other layout pays."""

  def __init__(self):
    self.forms = {}

  def to_layout(self, stacked_params):
    return stacked_params

  def make_cache(self, cfg, num_slots: int, max_length: int):
    return model.init_cache(cfg, num_slots, max_length)


# One CPU device: per-layer arrays and projection forms (cpu_decode).
STRATEGIES = (CpuDecodeLayout,)


def choose(cfg, params, *, num_slots: int, num_draft: int, placement) -> DecodeLayout:
  """The first of STRATEGIES that takes an engine of `num_slots` slots drafting
  `num_draft` tokens a step over `params` (model.init's tree) on `placement` (None: one
  device), else StackedLayout."""
  for strategy in STRATEGIES:
    layout = strategy.choose(cfg, params, num_slots=num_slots, num_draft=num_draft,
                             placement=placement)
    if layout is not None:
      return layout
  return StackedLayout()
