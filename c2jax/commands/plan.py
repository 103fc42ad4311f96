"""`c2jax plan`: what a config would allocate, computed abstractly (nothing is allocated).

  c2jax plan --config=configs/models.py:kimi_k25 --count
prints one JSON object: total and active parameter counts.
  c2jax plan --config=configs/pretrain.py:kimi_k25 --shardings --devices=1024
prints how every parameter is split over the job's mesh (axis sizes from
`config.parallel.mesh`, one of them -1 to absorb `--devices`) and the per-device bytes.
  c2jax plan --config=configs/pretrain.py:kimi_k25 --memory --mesh=fsdp=16,expert=8,context=2
compiles the real train step ahead of time on a simulated mesh of fake CPU devices (the
command re-executes itself with XLA_FLAGS=--xla_force_host_platform_device_count=N) and
prints per-device memory from XLA (arguments, outputs, temporaries, code, total, and
whether it fits --device-memory-gb) and the per-step communication volume by collective;
the last line is one JSON object with both. With an RL job config (task = 'rl', e.g.
configs/rl.py:kimi_k25) it compiles the RL learner's step instead, on an abstract packed
batch of the step's rollouts (--rl_rows overrides the row count) of actors.max_length
tokens each. `--mesh` overrides `config.parallel.mesh`
axis by axis. `--config` may be a model config or any job config with a `model` field
(--memory needs a job config).
  c2jax plan --config=configs/pretrain.py:kimi_k25 --roofline --mesh=fsdp=16,expert=8,context=2
compiles the same step and prints, per train step and per decode step, the model-formula
FLOPs beside XLA's compiled cost analysis, bytes moved, arithmetic intensity, and the
lower-bound time and MFU ceiling on every accelerator of c2jax/plan/accelerators.py
(c2jax/plan/roofline.py says how). With --measure (one device) it also measures this
machine's peaks and the real step times, and prints measured / bound for them.
  c2jax plan --config=configs/pretrain.py:kimi_k25 --memory --roofline --target=v5p-1024
compiles for a TPU slice with the real TPU compiler and no TPU (compile-only devices from
libtpu: pip install -e ".[tpu-compile]"): the job's step (train step, or the RL learner's),
and with --roofline also the rollout engine's prefill and decode programs, on the
topology's mesh. It prints per-device memory from the TPU compiler (and whether it fits
the chip's HBM), the compiled FLOPs and bytes, the compiler's time estimate and the MFU
it implies, and the collectives; the last line is one JSON object (c2jax/plan/target.py).
Topologies are named as GKE and MaxText name them (v4-8, v5e-16, v5p-8 ... v5p-1024,
v6e-256); --target_slices=N joins N slices over the data-centre network. All figures are
compiler estimates, not measured speed. --target=cpu (the default) is the fake-CPU plan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
from absl import flags
from ml_collections import config_flags

from c2jax.model import counting

_CONFIG = config_flags.DEFINE_config_file("config", None, "Model or job config file.")
_COUNT = flags.DEFINE_bool("count", False, "Print total and active parameter counts.")
_SHARDINGS = flags.DEFINE_bool("shardings", False, "Print every parameter's sharding.")
_MEMORY = flags.DEFINE_bool("memory", False, "Compile the train step on a simulated mesh "
                            "and print per-device memory and communication volume.")
_MESH = flags.DEFINE_string("mesh", "", "Mesh axis sizes overriding config.parallel.mesh, "
                            "e.g. data=1,fsdp=16,expert=8,context=2.")
_DEVICES = flags.DEFINE_integer("devices", None, "Mesh size for --shardings/--memory "
                                "(default: the devices present, or the mesh's product).")
_ROOFLINE = flags.DEFINE_bool("roofline", False, "Print FLOPs, bytes moved and lower-bound "
                              "step times on known accelerators for a train and a decode step.")
_MEASURE = flags.DEFINE_bool("measure", False, "With --roofline on one device: measure this "
                             "machine's peaks and the real train and decode steps beside the bound.")
_DECODE_BATCH = flags.DEFINE_integer("decode_batch", 8, "Sequences per decode step (--roofline).")
_DECODE_CONTEXT = flags.DEFINE_integer("decode_context", None, "Context length of the decode "
                                       "step (--roofline; default: train.seq_len).")
_RL_ROWS = flags.DEFINE_integer("rl_rows", None, "Rows of the RL learner's packed batch "
                                "(--memory with an RL job config; default: the step's "
                                "rollouts rounded up to the batch ways).")
_TARGET = flags.DEFINE_string("target", "cpu", "What --memory/--roofline compile for: cpu "
                              "(fake CPU devices) or a TPU slice, e.g. v5p-8, v6e-256.")
_TARGET_SLICES = flags.DEFINE_integer("target_slices", 1, "Slices of --target joined over "
                                      "the data-centre network (multi-slice).")
_TARGET_COST = flags.DEFINE_bool("target_cost", True, "With --target: also compile each "
                                 "step with its loops unrolled for the compiler's cost "
                                 "figures. --notarget_cost skips that compile, which grows "
                                 "with the layers: memory and collectives only.")
_TARGET_COST_ATTENTION = flags.DEFINE_enum(
    "target_cost_attention", "as_configured", ["as_configured", "dense"],
    "With --target: how the cost compile attends. Blockwise attention's tiles are a loop "
    "whose body XLA's cost analysis counts once (a lower bound); 'dense' costs every "
    "query-key pair instead (no causal skip: an upper bound). Memory always comes from "
    "the step as configured.")
_PREFILL_LEN = flags.DEFINE_integer("prefill_len", None, "Tokens per engine prefill chunk "
                                    "(--roofline --target; default: the decode context, "
                                    "at most 512).")
_ACTOR_TARGET = flags.DEFINE_string("actor_target", "", "With --target and an RL config: "
                                    "the slice or GPUs one actor's engine is planned on "
                                    "(its mesh: config.actors.parallel; default: --target).")
_DEVICE_MEMORY_GB = flags.DEFINE_float("device_memory_gb", 141.0, "Per-device memory to "
                                       "check the plan against (B300 288, H200 141).")

# Set in the re-executed child: the fake device count it was started with.
_CHILD_ENV = "C2JAX_PLAN_FAKE_DEVICES"


def main(argv) -> int:
  if len(argv) > 1:
    raise SystemExit(f"c2jax plan: unexpected arguments {argv[1:]}")
  cfg = _CONFIG.value
  if cfg is None:
    raise SystemExit("c2jax plan: pass --config=configs/<file>.py:<arg>")
  model_cfg = cfg.model if "model" in cfg else cfg
  if not (_COUNT.value or _SHARDINGS.value or _MEMORY.value or _ROOFLINE.value):
    raise SystemExit("c2jax plan: choose what to plan: --count, --shardings, --memory "
                     "and/or --roofline")
  if _MESH.value:
    if "parallel" not in cfg:
      raise SystemExit("c2jax plan: --mesh needs a job config (with a `parallel` group).")
    from c2jax.plan import memory
    try:
      cfg.parallel.mesh.update(memory.parse_mesh_flag(_MESH.value))
    except ValueError as err:
      raise SystemExit(f"c2jax plan: {err}") from None
  if _TARGET.value != "cpu" and (_MEMORY.value or _ROOFLINE.value):
    if _MEASURE.value:
      raise SystemExit("c2jax plan --measure times steps on this machine; it does not "
                       "combine with a compile-only --target.")
    from c2jax.commands import plan_target
    if _COUNT.value:
      print(json.dumps(counting.count_params(model_cfg)))
    return plan_target.run(cfg, _TARGET.value, _TARGET_SLICES.value, engine=_ROOFLINE.value,
                           rl_rows=_RL_ROWS.value, decode_batch=_DECODE_BATCH.value,
                           decode_context=_DECODE_CONTEXT.value,
                           prefill_len=_PREFILL_LEN.value, cost=_TARGET_COST.value,
                           cost_attention=_TARGET_COST_ATTENTION.value,
                           actor_target=_ACTOR_TARGET.value)
  if (_MEMORY.value or _ROOFLINE.value) and os.environ.get(_CHILD_ENV) is None:
    return _reexecute_with_fake_devices(cfg)
  if _COUNT.value:
    print(json.dumps(counting.count_params(model_cfg)))
  if _SHARDINGS.value:
    _print_shardings(cfg, model_cfg)
  compiled = None
  if _MEMORY.value:
    compiled = _print_memory(cfg)
  if _ROOFLINE.value:
    _print_roofline(cfg, compiled)
  return 0


def _print_shardings(cfg, model_cfg) -> None:
  from c2jax import parallel
  from c2jax.plan import shardings as plan

  parallel_cfg = cfg.parallel if "parallel" in cfg else parallel.default_parallel_config()
  devices = _DEVICES.value or jax.device_count()
  parallel.validate_parallel(parallel_cfg, devices)
  plans = plan.param_plans(model_cfg, parallel_cfg, devices)
  sizes = parallel.mesh.mesh_shape(parallel_cfg.mesh, devices)
  print(f"mesh {sizes} ({devices} devices)")
  print(plan.format_table(plans))
  print(json.dumps({"mesh": sizes, **plan.summarize(plans)}))


def _reexecute_with_fake_devices(cfg) -> int:
  """JAX fixes the CPU device count when it starts: run this command again in a process
  that sees exactly the mesh's number of fake devices."""
  from c2jax.plan import memory

  if "parallel" not in cfg or not ("train" in cfg or _is_rl(cfg)):
    raise SystemExit("c2jax plan --memory/--roofline needs a job config, e.g. "
                     "--config=configs/pretrain.py:kimi_k25 or configs/rl.py:kimi_k25.")
  if _ROOFLINE.value and _is_rl(cfg):
    raise SystemExit("c2jax plan --roofline models pretraining and decode steps; use a "
                     "pretraining config (--memory covers the RL learner's step).")
  try:
    devices = memory.mesh_devices(cfg.parallel.mesh, _DEVICES.value or jax.device_count())
  except ValueError as err:
    raise SystemExit(f"c2jax plan: {err}") from None
  env = memory.fake_device_env(devices)
  env[_CHILD_ENV] = str(devices)
  command = [sys.executable, "-m", "c2jax.cli", "plan", *sys.argv[2:]]
  return subprocess.run(command, env=env, check=False).returncode


def _check_child_devices() -> int:
  devices = jax.device_count()
  if devices != int(os.environ[_CHILD_ENV]):
    raise SystemExit(f"c2jax plan: JAX sees {devices} devices, expected "
                     f"{os.environ[_CHILD_ENV]}; unset XLA_FLAGS/JAX_PLATFORMS overrides.")
  return devices


def _print_memory(cfg):
  from c2jax.plan import hlo_comms, memory

  # A fresh compile every time: the compile time is part of the report, and a cached
  # executable would hide it.
  jax.config.update("jax_enable_compilation_cache", False)
  devices = _check_child_devices()
  from c2jax import parallel

  sizes = parallel.mesh.mesh_shape(cfg.parallel.mesh, devices)
  if _is_rl(cfg):
    rows = _RL_ROWS.value or memory.rl_batch_rows(cfg, memory.job_runtime(cfg))
    length, what = cfg.actors.max_length, "RL learner step"
  else:
    rows, length, what = cfg.train.batch_size, cfg.train.seq_len, "train step"
  print(f"mesh {sizes} ({devices} simulated devices); batch {rows} x {length} "
        f"tokens; remat {cfg.model.remat}; moe_impl {cfg.model.moe_impl}", flush=True)
  if _is_rl(cfg):
    try:
      compiled, seconds = memory.compile_rl_step(cfg, rows)
    except ValueError as err:
      raise SystemExit(f"c2jax plan: {err}") from None
  else:
    compiled, seconds = memory.compile_train_step(cfg)
  print(f"compiled the {what} in {seconds:.1f} s\n")
  report = memory.memory_report(compiled)
  state = memory.StateBytes.of(cfg)
  print(memory.format_memory_table(report, _DEVICE_MEMORY_GB.value, state) + "\n")
  volumes = hlo_comms.comm_volume(compiled.as_text(), devices)
  print(hlo_comms.format_comm_table(volumes) + "\n")
  print(json.dumps({
      "mesh": sizes, "devices": devices, "step": what, "batch_size": rows, "seq_len": length,
      "remat": cfg.model.remat, "compile_seconds": round(seconds, 1),
      "memory": memory.summary(report, _DEVICE_MEMORY_GB.value, state),
      "fits": {name: report.fits(gb) for name, gb in memory.DEVICE_MEMORY_GB.items()},
      "comms": hlo_comms.summary(volumes)}))
  return compiled


def _is_rl(cfg) -> bool:
  return cfg.get("task") == "rl"


def _print_roofline(cfg, compiled) -> None:
  import dataclasses

  from c2jax.plan import accelerators, memory, roofline, target

  devices = _check_child_devices()
  # XLA's cost analysis counts a loop body once: cost the step with every loop it can
  # drop (layer scans, the losses' vocabulary chunks) gone, as --target does.
  unrolled = target.cost_config(cfg)
  if compiled is None or unrolled is not None:
    compiled, seconds = memory.compile_train_step(unrolled or cfg)
    print(f"compiled the train step{' (loops unrolled, for its cost)' if unrolled else ''} "
          f"in {seconds:.1f} s")
  context = _DECODE_CONTEXT.value or cfg.train.seq_len
  train = roofline.train_step_cost(cfg, devices, compiled)
  decode = roofline.decode_step_cost(cfg.model, _DECODE_BATCH.value, context, devices)
  accels = dict(accelerators.ACCELERATORS)
  if _MEASURE.value:
    if devices != 1:
      raise SystemExit("c2jax plan --measure times the real steps on one device: "
                       "drop --mesh/--devices or use a one-device config.")
    from c2jax.plan import measure

    accels["this"] = accelerators.measure_cpu()
    train = dataclasses.replace(train, measured_s=measure.train_step_seconds(cfg))
    decode = dataclasses.replace(
        decode, measured_s=measure.decode_step_seconds(cfg.model, _DECODE_BATCH.value, context))
  costs = [train, decode]
  print(roofline.format_roofline(costs, accels))
  print(json.dumps({"devices": devices, "roofline": roofline.summary(costs, accels)}))
