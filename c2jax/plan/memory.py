"""Per-device memory of the real train step, compiled ahead of time on a simulated mesh.

    compiled, seconds = compile_train_step(cfg)   # abstract inputs: nothing is allocated
    compiled, seconds = compile_rl_step(cfg)      # the RL learner's step (task = 'rl')
    report = memory_report(compiled)
    print(format_memory_table(report, device_memory_gb=141))

`compile_rl_step` does the same for the RL learner's step (c2jax.rl.learner.runtime, the
same runtime) on an abstract packed batch: `rows` rows (default: the step's rollouts,
rounded up to the devices the batch splits over) of actors.max_length tokens, with router
indices for replay and the KL reference policy when config.rl.kl.coef > 0.
`compile_train_step` lowers and compiles exactly the step the training loop runs
(c2jax.train.loop.make_train_step: the config's optimizer, TrainState shardings, batch
sharding, donation) against jax.ShapeDtypeStructs that carry shardings, so a 1T-parameter
model plans on a laptop. Its mesh is every device of the process: to simulate N devices,
start the process with `fake_device_env(N)` (XLA can only be told the fake CPU device
count before JAX starts; `c2jax plan --memory` re-executes itself that way).

The numbers are XLA's buffer assignment for the CPU backend compiling the same SPMD
program: arguments and outputs are exact per-device shard sizes; temporaries follow the
CPU compiler's fusion and scheduling, which differ in detail from GPU/TPU compilers.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import jax
import numpy as np

from c2jax.parallel import mesh as mesh_lib
from c2jax.rl import job
from c2jax.rl.learner import runtime as learner_runtime
from c2jax.train import jobs, loop, runtime

GB = 10**9

# name -> per-device memory in GB (vendor figures), for --device-memory-gb shortcuts.
DEVICE_MEMORY_GB = {"b300": 288.0, "b200": 192.0, "h200": 141.0, "h100": 80.0}


def fake_device_env(num_devices: int, environ=None) -> dict[str, str]:
  """A copy of `environ` (default os.environ) that makes JAX see `num_devices` CPU devices."""
  env = dict(os.environ if environ is None else environ)
  kept = [flag for flag in env.get("XLA_FLAGS", "").split()
          if not flag.startswith("--xla_force_host_platform_device_count")]
  env["XLA_FLAGS"] = " ".join(kept + [
      f"--xla_force_host_platform_device_count={int(num_devices)}"])
  env["JAX_PLATFORMS"] = "cpu"
  return env


def parse_mesh_flag(text: str) -> dict[str, int]:
  """'data=1,fsdp=-1,expert=8' -> {'data': 1, 'fsdp': -1, 'expert': 8} (axes checked)."""
  sizes = {}
  for item in filter(None, (part.strip() for part in text.split(","))):
    name, sep, value = item.partition("=")
    if not sep or name not in mesh_lib.MESH_AXES:
      raise ValueError(f"--mesh item {item!r}: expected AXIS=SIZE with AXIS one of "
                       f"{mesh_lib.MESH_AXES}, e.g. --mesh=fsdp=-1,expert=8,context=2.")
    try:
      sizes[name] = int(value)
    except ValueError:
      raise ValueError(f"--mesh item {item!r}: the size must be an integer (or -1).") from None
  return sizes


def mesh_devices(mesh_cfg, num_devices: int | None) -> int:
  """How many devices a mesh config needs: its product, or `num_devices` if it has a -1."""
  sizes = [int(mesh_cfg[axis]) for axis in mesh_lib.MESH_AXES]
  if -1 in sizes:
    if num_devices is None:
      raise ValueError(f"mesh {dict(mesh_cfg)} has a -1 axis: give --devices=N to size it.")
    return int(num_devices)
  return math.prod(sizes)


def abstract_batch(cfg, sharding) -> dict[str, jax.ShapeDtypeStruct]:
  """The train step's batch (c2jax.train.step) as sharded shape structs, global shapes."""
  shape = (cfg.train.batch_size, cfg.train.seq_len)
  dtypes = {"loss_mask": np.float32}
  return {key: jax.ShapeDtypeStruct(shape, dtypes.get(key, np.int32), sharding=sharding)
          for key in jobs.BATCH_KEYS}


def compile_train_step(cfg, devices=None) -> tuple[jax.stages.Compiled, float]:
  """(compiled train step, compile seconds) on a mesh over `devices` (default: all of this
  process's; compile-only TPU devices for `c2jax plan --target`, see topologies.py)."""
  rt = loop.build_runtime(cfg, devices)
  step = loop.make_train_step(rt)
  state = loop.abstract_state(rt)
  batch = abstract_batch(cfg, rt.batch_sharding)
  begun = time.perf_counter()
  with rt.scope():
    compiled = step.lower(state, batch).compile()
  return compiled, time.perf_counter() - begun


def job_runtime(cfg, devices=None):
  """The runtime of a pretraining / SFT job or (task = 'rl') of the RL learner, on
  `devices` (default: all of this process's)."""
  if cfg.get("task") == "rl":
    job.validate(cfg, jax.device_count() if devices is None else len(devices))
    return learner_runtime.build(cfg, devices)
  return loop.build_runtime(cfg, devices)


def rl_batch_rows(cfg, rt) -> int:
  """Rows of the RL learner's packed batch when every rollout fits one row
  (c2jax.rl.learner.runtime.build_batch)."""
  return learner_runtime.batch_rows(cfg, learner_runtime.rollouts_per_step(cfg),
                                    rt.batch_ways())


def abstract_rl_batch(cfg, rt, rows: int) -> dict[str, jax.ShapeDtypeStruct]:
  """The learner's packed batch (c2jax.rl.learner.step) as sharded shape structs."""
  shardings = learner_runtime.batch_shardings(rt)
  length = cfg.actors.max_length
  moe_layers = cfg.model.num_layers - cfg.model.first_k_dense
  shapes = {"tokens": (rows, length), "valid": (rows, length), "loss_mask": (rows, length),
            "sampler_logprobs": (rows, length),
            "router_indices": (rows, length, moe_layers, cfg.model.moe.num_experts_per_tok),
            "advantages": (rows,)}
  dtypes = {"sampler_logprobs": np.float32, "advantages": np.float32}
  return {name: jax.ShapeDtypeStruct(shape, dtypes.get(name, np.int32),
                                     sharding=shardings[name])
          for name, shape in shapes.items()}


def compile_rl_step(cfg, rows: int | None = None,
                    devices=None) -> tuple[jax.stages.Compiled, float]:
  """(compiled RL learner step, compile seconds) on a mesh over `devices` (default: this
  process's)."""
  rt = job_runtime(cfg, devices)
  step = learner_runtime.make_step(rt)
  state = runtime.abstract_state(rt)
  ref = state.params if cfg.rl.kl.coef > 0 else None
  rows = rl_batch_rows(cfg, rt) if rows is None else int(rows)
  ways = rt.batch_ways() * cfg.learner.microbatches
  if rows <= 0 or rows % ways:
    raise ValueError(f"--rl_rows = {rows}: the packed batch's rows split over the "
                     f"{rt.batch_ways()} devices of the 'batch' rule, each share into "
                     f"learner.microbatches = {cfg.learner.microbatches}; use a positive "
                     f"multiple of {ways}.")
  batch = abstract_rl_batch(cfg, rt, rows)
  begun = time.perf_counter()
  with rt.scope():
    compiled = step.lower(state, ref, batch).compile()
  return compiled, time.perf_counter() - begun


@dataclasses.dataclass(frozen=True)
class StateBytes:
  """Per-device bytes of the train state by role, in the mixed-precision policy's dtypes
  (c2jax/model/config.py): exact shard sizes from the runtime's shardings."""
  param_bytes: int
  param_dtype: str
  opt_state_bytes: int
  opt_state_dtype: str

  @classmethod
  def of(cls, cfg, devices=None) -> StateBytes:
    state = runtime.abstract_state(job_runtime(cfg, devices))

    def shard_bytes(tree) -> int:
      return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
                 for leaf in jax.tree.leaves(tree))
    return cls(shard_bytes(state.params), cfg.model.param_dtype,
               shard_bytes(state.opt_state), cfg.model.opt_state_dtype)


@dataclasses.dataclass(frozen=True)
class MemoryReport:
  """Per-device bytes from XLA's buffer assignment of one compiled program."""
  argument_bytes: int
  output_bytes: int
  alias_bytes: int  # outputs written into donated arguments (counted once)
  temp_bytes: int
  code_bytes: int

  @property
  def total_bytes(self) -> int:
    """Live at the peak: arguments, outputs not aliased to them, temporaries, code."""
    return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
            + self.code_bytes)

  def fits(self, device_memory_gb: float) -> bool:
    return self.total_bytes <= device_memory_gb * GB


def memory_report(compiled: jax.stages.Compiled) -> MemoryReport:
  stats = compiled.memory_analysis()
  if stats is None:
    raise RuntimeError("this JAX backend gives no memory analysis for compiled programs; "
                       "plan on CPU (JAX_PLATFORMS=cpu) or for a TPU --target.")
  return MemoryReport(
      argument_bytes=int(stats.argument_size_in_bytes),
      output_bytes=int(stats.output_size_in_bytes),
      alias_bytes=int(stats.alias_size_in_bytes),
      temp_bytes=int(stats.temp_size_in_bytes),
      code_bytes=int(stats.generated_code_size_in_bytes))


def _gb(num_bytes: float) -> str:
  return f"{num_bytes / GB:,.2f}"


def format_table(rows: list[tuple[str, ...]]) -> str:
  """Left-aligned columns; the first row is the header."""
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def format_memory_table(report: MemoryReport, device_memory_gb: float,
                        state: StateBytes | None = None) -> str:
  rows = [("per device", "GB"),
          ("arguments (params, optimizer state, batch)", _gb(report.argument_bytes))]
  if state is not None:
    rows += [(f"  of which parameters ({state.param_dtype} masters)",
              _gb(state.param_bytes)),
             (f"  of which optimizer moments ({state.opt_state_dtype})",
              _gb(state.opt_state_bytes))]
  rows += [("outputs", _gb(report.output_bytes)),
           ("  of which aliased to donated arguments", _gb(report.alias_bytes)),
           ("temporaries (activations, gradients, buffers)", _gb(report.temp_bytes)),
           ("generated code", _gb(report.code_bytes)),
           ("total", _gb(report.total_bytes))]
  verdict = "fits" if report.fits(device_memory_gb) else "does NOT fit"
  headroom = device_memory_gb * GB - report.total_bytes
  return (format_table(rows) + f"\n{verdict} in {device_memory_gb:g} GB per device "
          f"(headroom {_gb(headroom)} GB)")


def summary(report: MemoryReport, device_memory_gb: float,
            state: StateBytes | None = None) -> dict:
  """The report as one JSON-ready dict (bytes, plus the verdict)."""
  extra = dataclasses.asdict(state) if state is not None else {}
  return {**dataclasses.asdict(report), **extra, "total_bytes": report.total_bytes,
          "total_gb": round(report.total_bytes / GB, 3),
          "device_memory_gb": device_memory_gb, "fits": report.fits(device_memory_gb)}
