"""The training runtime shared by every job that updates parameters: pretraining, SFT and
the RL learner.

    rt = runtime.build_runtime(cfg, optimizer=..., model_cfg=..., seed=...)
    state = runtime.init_state(rt)                       # born sharded
    step = rt.jit_step(fn, extra=(rt.state_shardings.params,))   # donated state
    with rt.scope():
      state, metrics = step(state, *extra, rt.place(batch))

A runtime holds what a config decides about placement: the mesh (config.parallel.mesh),
the logical-axis rules (config.parallel.rules), the sharding of the TrainState (parameters
and their Adam moments alike, so FSDP / expert / context parallelism apply to the
optimizer state too), the optimizer (built by the job with the mixed-precision policy:
fp32 master parameters, moments in model.opt_state_dtype) and the batch shardings. The
step functions themselves (`train_step`, `rl_step`) are pure and know nothing of it.

`LateMetrics` reads a step's metrics one step late (the host never waits on the device
except where it must) and stops a run on a non-finite loss with a message naming the step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from c2jax import model, parallel
from c2jax.parallel import context as context_lib
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train.step import TrainState

P = jax.sharding.PartitionSpec


class NonFiniteLossError(RuntimeError):
  """The loss of a step is NaN or infinite; the run stops before saving that step."""


@dataclasses.dataclass
class Runtime:
  """Everything derived from a config that a job's loop, its evals and its plans share."""
  cfg: object
  model_cfg: object
  mesh: jax.sharding.Mesh
  rules: tuple
  optimizer: optax.GradientTransformation
  state_shardings: object
  batch_sharding: jax.sharding.NamedSharding  # [B, L] arrays
  # The TrainState as ShapeDtypeStructs, no shardings (abstract_state adds them): derived
  # with the shardings, from the same trace of the model's init.
  abstract: object
  seed: int = 0

  def scope(self):
    return _Scope(self.mesh, self.rules)

  def sharding(self, *logical_axes) -> jax.sharding.NamedSharding:
    """The mesh sharding of an array whose dimensions have these logical names."""
    return nn.logical_to_mesh_sharding(P(*logical_axes), self.mesh, self.rules)

  def batch_shardings(self, ranks: dict[str, int]) -> dict:
    """Per field of the given rank: 1 -> over 'batch'; >= 2 -> over ('batch', 'length'),
    trailing axes whole (router indices [B, L, Lm, K])."""
    def of(ndim):
      if ndim == 1:
        return self.sharding("batch")
      return self.sharding("batch", "length", *([None] * (ndim - 2)))
    return {key: of(ndim) for key, ndim in ranks.items()}

  def batch_ways(self) -> int:
    """Devices the 'batch' rule splits the batch over (rows must divide by it)."""
    return batch_ways(dict(self.mesh.shape), self.rules)

  def context_shards(self) -> int:
    return context_lib.num_shards(self.mesh, self.rules)

  def place(self, batch: dict) -> dict:
    """A global host batch (the same on every process) on the mesh: each process keeps the
    slices its devices hold, so single- and multi-process runs see the same arrays."""
    shardings = self.batch_shardings({k: np.ndim(v) for k, v in batch.items()})
    return {key: jax.make_array_from_callback(np.shape(value), shardings[key],
                                              lambda index, v=value: np.asarray(v)[index])
            for key, value in batch.items()}

  def jit_step(self, step_fn: Callable, extra: tuple = (), batch_shardings=None):
    """`step_fn(state, *extra, batch) -> (state, metrics)` jitted with the state donated
    and kept in its shardings; `extra` are the shardings of the arguments between state
    and batch (None for an argument that is None); metrics come back replicated."""
    batch_shardings = self.batch_sharding if batch_shardings is None else batch_shardings
    return jax.jit(step_fn, in_shardings=(self.state_shardings, *extra, batch_shardings),
                   out_shardings=(self.state_shardings, None), donate_argnums=0)


class _Scope:
  """Mesh + logical-axis rules active while tracing and running jitted functions."""

  def __init__(self, mesh, rules):
    # jax.set_mesh (jax >= 0.7) sets the abstract mesh that flax's logical constraints and
    # expert parallelism read; a bare `with mesh:` no longer does.
    set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
    self._contexts = [set_mesh(mesh), nn.logical_axis_rules(rules)]

  def __enter__(self):
    for context in self._contexts:
      context.__enter__()

  def __exit__(self, *exc):
    for context in reversed(self._contexts):
      context.__exit__(*exc)


def batch_ways(sizes: dict[str, int], rules) -> int:
  """The product of the mesh axes the first 'batch' rule maps to."""
  for name, axes in rules:
    if name == "batch":
      return math.prod(sizes.get(axis, 1) for axis in
                       (axes if isinstance(axes, tuple) else (axes,)) if axis)
  return 1


def build_runtime(cfg, *, optimizer: optax.GradientTransformation, model_cfg=None,
                  seed: int = 0, devices=None) -> Runtime:
  """The runtime of a validated job config (its `parallel` and `model` sections).

  `optimizer` is the job's (its schedule and precision policy); `model_cfg` the model the
  step runs when it differs from cfg.model in implementation only (the RL learner's
  router-replay filter); `seed` initialises fresh parameters; `devices` those the mesh
  spans (default: all of this process's).
  """
  model_cfg = cfg.model if model_cfg is None else model_cfg
  mesh = parallel.make_mesh(cfg.parallel.mesh, devices)
  rules = parallel.rules_of(cfg.parallel)
  abstract_params, param_specs = model.abstract_params(model_cfg)
  abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
  specs = TrainState(step=P(), params=param_specs,
                     opt_state=optimizer_specs(abstract_opt, param_specs))
  state_shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
  batch_sharding = nn.logical_to_mesh_sharding(P("batch", "length"), mesh, rules)
  abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params,
                        opt_state=abstract_opt)
  return Runtime(cfg, model_cfg, mesh, rules, optimizer, state_shardings, batch_sharding,
                 abstract, int(seed))


def _dict_keys(path) -> tuple:
  return tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))


def optimizer_specs(abstract_opt, param_specs):
  """Optimizer-state leaves shaped like a parameter (Adam moments) share its sharding.

  They are found by their key path: an optimizer state nests copies of the parameter tree,
  so a moment's dict-key path ends with its parameter's path. Scalars (counts) replicate.
  """
  by_path = {_dict_keys(path): spec for path, spec in jax.tree_util.tree_leaves_with_path(
      param_specs, is_leaf=lambda x: isinstance(x, P))}

  def spec_of(path, leaf):
    keys = _dict_keys(path)
    for start in range(len(keys)):
      spec = by_path.get(keys[start:])
      if spec is not None and len(spec) == leaf.ndim:
        return spec
    return P()
  return jax.tree_util.tree_map_with_path(spec_of, abstract_opt)


def init_state(rt: Runtime) -> TrainState:
  """A fresh TrainState, each array created directly in its sharding."""
  def create(rng):
    params = model.init(rt.model_cfg, rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=rt.optimizer.init(params))
  with rt.scope():
    return jax.jit(create, out_shardings=rt.state_shardings)(jax.random.key(rt.seed))


def abstract_state(rt: Runtime) -> TrainState:
  """The TrainState as ShapeDtypeStructs with shardings (restore targets, AOT plans)."""
  return checkpoint_lib.abstract_like(rt.abstract, rt.state_shardings)


def copy_params(rt: Runtime, params):
  """A copy of sharded parameters in the same shardings (e.g. a frozen reference policy,
  which must survive the step donating the state's buffers)."""
  return jax.jit(lambda p: jax.tree.map(jnp.copy, p),
                 out_shardings=rt.state_shardings.params)(params)


class LateMetrics:
  """Reads step N's device metrics after step N + 1 is dispatched.

      late = LateMetrics(report)       # report(step, host_metrics, extra) -> row
      late.push(step, device_metrics, extra)   # reports the previous step, if any
      late.flush()                     # reports the pending step now (checkpoints, end)

  Every report checks the loss first: a NaN or infinite loss raises NonFiniteLossError
  naming the step, so nothing after it (a checkpoint) is saved. `on_nonfinite(step)`
  gives the message's advice (e.g. the last good checkpoint).
  """

  def __init__(self, report: Callable, on_nonfinite: Callable[[int], str] = lambda s: ""):
    self._report, self._advice = report, on_nonfinite
    self._pending = None
    self.last: dict = {}

  def push(self, step: int, metrics, extra=None):
    row = self.flush()
    self._pending = (step, metrics, extra)
    return row

  def flush(self):
    if self._pending is None:
      return None
    step, metrics, extra = self._pending
    self._pending = None
    host = {k: float(v) for k, v in jax.device_get(metrics).items()}
    check_finite(step, host.get("loss", 0.0), self._advice(step))
    self.last = self._report(step, host, extra)
    return self.last


def check_finite(step: int, loss: float, advice: str = "") -> None:
  if not math.isfinite(loss):
    raise NonFiniteLossError(f"loss is {loss} at step {step}; stopping. {advice}".strip())
