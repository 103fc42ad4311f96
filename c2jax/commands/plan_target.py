"""`c2jax plan --memory/--roofline --target=<TPU slice | GPUs>`: the steps through the
accelerator's compiler.

The printing side of c2jax/plan/target.py (which says what is compiled and how); this
process's own backend stays the CPU, the steps compile for the target's compile-only devices.
"""

from __future__ import annotations

import json
import os

import jax


def _prepare_process() -> None:
  # Compile-only devices need no chip, so this process may load libtpu while another
  # process (a test run, a second plan) holds libtpu's single-user lock file; and its own
  # backend is the CPU (no attempt to open a TPU that is not here).
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  jax.config.update("jax_platforms", "cpu")


def run(cfg, target_name: str, slices: int, *, engine: bool, rl_rows, decode_batch: int,
        decode_context, prefill_len, cost: bool = True,
        cost_attention: str = "as_configured") -> int:
  """`cost=False` (--notarget_cost): the steps as configured only, no cost compile;
  `cost_attention` (--target_cost_attention): how the cost compile attends."""
  from c2jax.plan import hlo_comms, memory, target as target_lib, topologies

  if "parallel" not in cfg or not ("train" in cfg or cfg.get("task") == "rl"):
    raise SystemExit("c2jax plan --target needs a job config, e.g. "
                     "--config=configs/pretrain.py:kimi_k25 or configs/rl.py:kimi_k25.")
  try:
    target = topologies.parse_target(target_name, slices)
  except ValueError as err:
    raise SystemExit(f"c2jax plan: {err}") from None
  _prepare_process()
  jax.config.update("jax_enable_compilation_cache", False)  # compile time is reported
  devices = target.devices()
  from c2jax import parallel

  try:
    sizes = parallel.mesh.mesh_shape(cfg.parallel.mesh, len(devices))
  except Exception as err:  # ConfigError: name the key and the device count
    raise SystemExit(f"c2jax plan --target={target.label()} ({len(devices)} chips): "
                     f"{err}") from None
  print(f"target {target.label()}: {target.num_devices} x {devices[0].device_kind} "
        f"(topology {target.topology_name}, compile-only devices); mesh {sizes}; remat "
        f"{cfg.model.remat}; moe_impl {cfg.model.moe_impl}; dtype {cfg.model.dtype}, "
        f"params {cfg.model.param_dtype}. Every figure below is a {target.compiler} "
        "estimate, not a measured speed.\n", flush=True)
  costed = target.has_cost_model and cost
  if costed and cost_attention == "dense" and cfg.model.attention_impl != "dense":
    print(f"cost compile: dense attention in place of '{cfg.model.attention_impl}' "
          "(every query-key pair costed, no causal skip: the time estimate is an upper "
          "bound for the attention; memory is the step's as configured)\n", flush=True)
  try:
    steps = [target_lib.compile_job_step(cfg, devices, rl_rows, costed=costed,
                                         cost_attention=cost_attention)]
  except ValueError as err:
    raise SystemExit(f"c2jax plan: {err}") from None
  if engine:
    context = decode_context or (cfg.actors.max_length if cfg.get("task") == "rl"
                                 else cfg.train.seq_len)
    ways = target_lib.engine_placement(cfg.parallel, devices, len(devices)).slot_ways()
    slots = -(-decode_batch // ways) * ways  # slots split evenly over the batch axes
    steps += target_lib.compile_engine_steps(cfg, devices, slots=slots, context=context,
                                             prefill=prefill_len or min(context, 512),
                                             costed=costed, cost_attention=cost_attention)
  reports = []
  for step in steps:
    report = target_lib.step_report(step, target, costed=costed)
    reports.append(report)
    print(target_lib.format_report(report, target))
    if report["collectives"] is None:
      print(f"collectives not counted: {report['collectives_note']}\n", flush=True)
    else:
      print(hlo_comms.format_comm_table(step.comm_volumes) + "\n",
            flush=True)
  state = memory.StateBytes.of(cfg, devices)
  main = reports[0]
  print(json.dumps({
      "target": target.name, "slices": target.slices, "device_kind": devices[0].device_kind,
      "devices": len(devices), "mesh": sizes, "step": main["step"],
      "memory": {**main["memory"], "param_bytes": state.param_bytes,
                 "opt_state_bytes": state.opt_state_bytes},
      "fits": main["fits"], "flops": main["flops"],
      "cost_model_seconds": main["cost_model_seconds"],
      "cost_model_note": main["cost_model_note"],
      "mfu_estimate": main["mfu_estimate"], "collectives": main["collectives"],
      "compile_seconds": main["compile_seconds"],
      "loops_costed_once": main["loops_costed_once"],
      "cost_attention": cost_attention if costed else None,
      "mosaic_calls": main["mosaic_calls"],
      "sparsecore_offloads": main["sparsecore_offloads"],
      "engine": {r["step"]: r for r in reports[1:]}}))
  return 0
