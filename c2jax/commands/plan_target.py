"""`c2jax plan --memory/--roofline --target=<TPU slice | GPUs>`: the steps through the
accelerator's compiler.

The printing side of c2jax/plan/target.py (which says what is compiled and how); this
process's own backend stays the CPU, the steps compile for the target's compile-only devices.
"""

from __future__ import annotations

import dataclasses
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
        cost_attention: str = "as_configured", actor_target: str = "") -> int:
  """`cost=False` (--notarget_cost): the steps as configured only, no cost compile;
  `cost_attention` (--target_cost_attention): how the cost compile attends; with an RL
  config, `actor_target` (--actor_target; default: the learner's) is where one actor's
  engine is planned (_plan_actors)."""
  from c2jax.plan import hlo_comms, memory, target as target_lib, topologies

  if "parallel" not in cfg or not ("train" in cfg or cfg.get("task") == "rl"):
    raise SystemExit("c2jax plan --target needs a job config, e.g. "
                     "--config=configs/pretrain.py:kimi_k25 or configs/rl.py:kimi_k25.")
  if actor_target and cfg.get("task") != "rl":
    raise SystemExit(f"c2jax plan --actor_target={actor_target}: plans an RL job's actors; "
                     "pass an RL config, e.g. --config=configs/rl.py:kimi_k25.")
  try:
    target = topologies.parse_target(target_name, slices)
  except ValueError as err:
    raise SystemExit(f"c2jax plan: {err}") from None
  try:  # checked before the learner's compile, which may take minutes
    actors_on = topologies.parse_target(actor_target) if actor_target else target
  except ValueError as err:
    raise SystemExit(f"c2jax plan --actor_target: {err}") from None
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
  actors = None
  if cfg.get("task") == "rl":
    actors = _plan_actors(cfg, actors_on, reports[0], costed=costed,
                          cost_attention=cost_attention)
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
      "engine": {r["step"]: r for r in reports[1:]}, "actors": actors}))
  return 0


def _plan_actors(cfg, target, learner: dict, *, costed: bool, cost_attention: str) -> dict:
  """One RL actor's engine on its own mesh (config.actors.parallel over the first chips
  of `target`, a topologies target), with its slots x actors.max_length KV cache: the engine's prefill
  and decode programs, the bytes it holds, decode tokens/s per chip, and the fleet line
  (c2jax/plan/fleet.py) against the learner step's time estimate."""
  from c2jax import config as configlib
  from c2jax.plan import fleet as fleet_lib, target as target_lib
  from c2jax.rollout import jax_engine, resident

  try:
    placement = target_lib.actor_placement(cfg, target.devices())
  except configlib.ConfigError as err:
    raise SystemExit(f"c2jax plan: the actors' mesh on {target.label()} "
                     f"({target.num_devices} chips): {err}") from None
  chips, slots, length = placement.mesh.size, cfg.actors.slots, cfg.actors.max_length
  prefill = min(length, jax_engine.DEFAULT_BUCKETS[-1])
  print(f"actor engine on {target.label()}: mesh {dict(placement.mesh.shape)} "
        f"(actors.parallel) on {chips} of its {target.num_devices} chips; {slots} slots x "
        f"{length} tokens (actors.slots x actors.max_length)\n", flush=True)
  steps = target_lib.compile_engine_steps(
      cfg, None, slots=slots, context=length, prefill=prefill, costed=costed,
      cost_attention=cost_attention, placement=placement, max_length=length,
      weights_quant=cfg.actors.weights_quant)
  reports = {}
  for name, step in zip(("prefill", "decode"), steps):
    report = target_lib.step_report(step, target, costed=costed)
    reports[name] = report
    print("actor " + target_lib.format_report(report, target) + "\n", flush=True)
  held = target_lib.engine_state_bytes(cfg.model, placement, slots=slots, max_length=length,
                                       weights_quant=cfg.actors.weights_quant)
  quant = cfg.actors.weights_quant
  print(f"actor engine holds per device: weights {held['weights_bytes'] / 1e9:,.3f} GB "
        f"({'/'.join(held['weights_dtypes'])}, "
        f"{'as published' if quant == 'none' else 'routed experts ' + quant}), KV cache "
        f"{held['cache_bytes'] / 1e9:,.3f} GB ({'/'.join(held['cache_dtypes'])})\n"
        f"actor engine {resident.describe(held['weight_groups'])}", flush=True)
  # The decode program's loop over tokens is costed once: its estimate is one step.
  decode_s, prefill_s = (reports["decode"]["cost_model_seconds"],
                         reports["prefill"]["cost_model_seconds"])
  learner_s = learner["cost_model_seconds"]
  out = {"target": target.name, "device_kind": placement.mesh.devices.flat[0].device_kind,
         "chips": chips, "mesh": dict(placement.mesh.shape), "slots": slots,
         "max_length": length, **held, "prefill": reports["prefill"],
         "decode": reports["decode"], "decode_step_seconds": decode_s,
         "tokens_per_s_per_chip": None, "fleet": None}
  missing = [name for name, value in (("the learner step", learner_s),
                                      ("the actor's decode", decode_s),
                                      ("the actor's prefill", prefill_s)) if not value]
  if missing:
    out["fleet_note"] = (f"no fleet line: no time estimate for {', '.join(missing)} "
                         f"(the {target.compiler} gives none here)")
    print(out["fleet_note"] + "\n", flush=True)
    return out
  speed = fleet_lib.ActorSpeed(slots=slots, chips=chips, decode_step_s=decode_s,
                               prefill_tokens=prefill, prefill_s=prefill_s)
  rollout = fleet_lib.RolloutShape.of(cfg)
  estimate = fleet_lib.fleet(
      rollout, learner_step_s=learner_s,
      rollouts_per_step=cfg.learner.groups_per_step * cfg.rl.group_size, actor=speed,
      max_lag=cfg.rl.queue.max_lag)
  out["tokens_per_s_per_chip"] = speed.tokens_per_s_per_chip
  out["fleet"] = {**dataclasses.asdict(estimate), "lag_ok": estimate.lag_ok,
                  "idle_fraction": estimate.idle_fraction(estimate.meshes),
                  "rollout_tokens": rollout.total_tokens,
                  "rollout_decode_tokens": rollout.decode_tokens}
  print(f"actor decode: {decode_s * 1e3:,.3f} ms per step of {slots} tokens: "
        f"{speed.tokens_per_s_per_chip:,.1f} tokens/s per chip (compiler estimates; "
        f"rollouts of up to {rollout.total_tokens} tokens, {rollout.decode_tokens} decoded)",
        flush=True)
  print(estimate.line() + "\n", flush=True)
  return out
