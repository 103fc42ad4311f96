"""`c2jax plan --target=<TPU slice | GPUs>`: the real steps compiled by the accelerator's own
compiler (libtpu's, or XLA's GPU compiler through the CUDA plugin), deviceless.

    target = topologies.parse_target("v5p-8")
    devices = target.devices()
    step = compile_job_step(cfg, devices)             # train step, or the RL learner's
    engine = compile_engine_steps(cfg, devices, slots=8, context=256, prefill=256)
    report = step_report(step, target)

Every step is the one the job runs (c2jax.train.loop / c2jax.rl.learner.runtime / the
rollout engine's prefill and decode programs), jitted with the run's mesh, logical-axis
rules, shardings, donation, remat, dtypes and moe_impl, traced under a mesh of the
topology's compile-only devices (so Pallas kernels compile through Mosaic for the TPU or
Mosaic GPU, c2jax_kernels.target_platform) and compiled by that platform's compiler.
Nothing runs.

What it reports, per device, all of it compiler estimates and none of it a measured speed:
  memory            the compiler's buffer assignment (arguments, outputs, aliases,
                    temporaries, code), and whether the total fits the chip's HBM;
  flops, bytes      the compiled cost analysis (None for GPU targets: XLA's GPU compiler
                    has none for compile-only devices);
  cost_model_s      the compiler's own time estimate (`optimal_seconds`; TPU only;
                    None, with the reason, where it is not positive: an op the cost
                    model cannot cost, such as a gather or scatter offloaded to the
                    SparseCore or an all-reduce of booleans, turns it negative);
  mfu_estimate      model FLOPs (the formula of roofline.py) / (cost_model_s x chip peak);
  mosaic_calls      Pallas kernels in the program, compiled through Mosaic / Mosaic GPU;
  sparsecore_offloads  gathers and scatters the TPU compiler moved to the SparseCore;
  collectives       from the compiled HLO (hlo_comms: loop trip counts applied; None,
                    with the reason, when one sits in a loop of data-dependent length,
                    as in the engine's decode loop, which stops early on stop tokens).
XLA's cost analysis counts a while loop's body once, so a scanned layer stack would be
costed as one layer: the cost figures come from a second compile with the layer scans
unrolled (`model.scan_unroll` = layers) and the losses' vocabulary chunks made one
(`train.loss_vocab_chunk`, `train.mtp_vocab_chunk` = the vocabulary), the memory from the
step as configured. Loops that remain (blockwise attention tiles, the decode loop's
steps) are still counted once; the report names how many there are. With
`cost_attention='dense'` (`c2jax plan --target_cost_attention=dense`) the cost compile
runs dense attention instead of blockwise tiles: every query-key pair is costed, with no
causal skip and with the float32 scores' traffic, so the time estimate is an upper bound
for the tiles where the default is a lower bound.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time

import jax
import jax.numpy as jnp

from c2jax import model
from c2jax import parallel as parallel_lib
from c2jax.plan import hlo_comms
from c2jax.plan import memory as memory_lib
from c2jax.plan import roofline
from c2jax.plan import topologies
from c2jax.rollout import decode_loop
from c2jax.rollout import jax_engine
from c2jax.rollout import prefill as prefill_lib
from c2jax.rollout import resident
from c2jax.rollout import sharding as engine_sharding


@dataclasses.dataclass(frozen=True)
class CompiledStep:
  label: str
  compiled: jax.stages.Compiled         # as configured: memory, collectives
  cost_compiled: jax.stages.Compiled    # layer scans unrolled: FLOPs, time estimate
  seconds: float                        # compile time, both compiles
  model_flops: float                    # per device, the formula
  num_devices: int

  # The HLO text of a large model is big: each is printed and parsed once.
  @functools.cached_property
  def hlo_text(self) -> str:
    return self.compiled.as_text()

  @functools.cached_property
  def cost_hlo_text(self) -> str:
    return self.hlo_text if self.cost_compiled is self.compiled else (
        self.cost_compiled.as_text())

  @functools.cached_property
  def comm_volumes(self) -> dict:
    """hlo_comms.comm_volume of the compiled step; raises ValueError as it does."""
    return hlo_comms.comm_volume(self.hlo_text, self.num_devices)


COST_ATTENTION = ("as_configured", "dense")


def cost_config(cfg, losses: bool = True, attention: str = "as_configured"):
  """cfg for the cost compile: the layer scans unrolled and (`losses`) the losses'
  vocabulary-chunk loops (train.loss_vocab_chunk, train.mtp_vocab_chunk) cut to one
  chunk, a loop of one trip that XLA removes, so every layer and every column is costed;
  `attention='dense'`: dense attention instead of blockwise tiles (module docstring).
  None when cfg is that already."""
  if attention not in COST_ATTENTION:
    raise ValueError(f"cost attention {attention!r}: one of {COST_ATTENTION}")
  unrolled = cfg.copy_and_resolve_references()
  layers = max(cfg.model.num_layers, cfg.model.num_mtp_layers, 1)
  changed = cfg.model.scan_unroll < layers
  unrolled.model.scan_unroll = max(layers, cfg.model.scan_unroll)
  if attention == "dense" and cfg.model.attention_impl != "dense":
    unrolled.model.attention_impl, changed = "dense", True
  train = unrolled.get("train")
  for key in ("loss_vocab_chunk", "mtp_vocab_chunk") if losses else ():
    if train is not None and 0 < train.get(key, 0) < cfg.model.vocab_size:
      train[key], changed = cfg.model.vocab_size, True
  return unrolled if changed else None


def _twice(compile_fn, cfg, costed: bool, cost_attention: str) -> tuple:
  """(as configured, with layers unrolled (or the same one), seconds); `costed=False` (a
  compiler without a cost model) skips the unrolled compile."""
  begun = time.perf_counter()
  compiled = compile_fn(cfg)
  unrolled_cfg = cost_config(cfg, attention=cost_attention) if costed else None
  cost = compiled if unrolled_cfg is None else compile_fn(unrolled_cfg)
  return compiled, cost, time.perf_counter() - begun


def compile_job_step(cfg, devices, rl_rows: int | None = None, *, costed: bool = True,
                     cost_attention: str = "as_configured") -> CompiledStep:
  """The job's step (train step; RL learner step for task = 'rl') for `devices`;
  `cost_attention`: how the cost compile attends (cost_config)."""
  devices = list(devices)
  if cfg.get("task") == "rl":
    rows = rl_rows or memory_lib.rl_batch_rows(cfg, memory_lib.job_runtime(cfg, devices))
    fn = lambda c: memory_lib.compile_rl_step(c, rows, devices)[0]
    tokens, seq_len, label = rows * cfg.actors.max_length, cfg.actors.max_length, \
        "RL learner step"
  else:
    fn = lambda c: memory_lib.compile_train_step(c, devices)[0]
    tokens, seq_len = cfg.train.batch_size * cfg.train.seq_len, cfg.train.seq_len
    label = "train step"
  compiled, cost, seconds = _twice(fn, cfg, costed, cost_attention)
  flops = roofline.train_flops_per_token(cfg.model, seq_len) * tokens / len(devices)
  return CompiledStep(label, compiled, cost, seconds, flops, len(devices))


def engine_placement(parallel_cfg, devices, slots: int) -> engine_sharding.Placement:
  """The engine's mesh over `devices`: the job's axis sizes with context folded into fsdp
  (the engine never splits sequences), checked as the engine checks its own."""
  sizes = parallel_lib.mesh.mesh_shape(parallel_cfg.mesh, len(devices))
  engine_cfg = parallel_cfg.copy_and_resolve_references()
  engine_cfg.mesh.update({**sizes, "fsdp": sizes["fsdp"] * sizes["context"], "context": 1})
  engine_sharding.check_config(engine_cfg, slots)
  return engine_sharding.Placement(parallel_lib.make_mesh(engine_cfg.mesh, devices),
                                   parallel_lib.rules_of(engine_cfg))


def _abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def _scalar(dtype, sharding, shape=()):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _compile_engine(model_cfg, placement, *, slots: int, max_length: int, prefill: int,
                    decode_steps: int, prefill_attention: str = "auto",
                    weights_quant: str = "none") -> dict[str, jax.stages.Compiled]:
  params = jax.eval_shape(functools.partial(model.init, model_cfg), jax.random.key(0))
  params = resident.abstract_resident(
      _abstract(params, placement.param_shardings(model_cfg, params)), weights_quant)
  cache_shardings = placement.cache_shardings(model_cfg)
  cache = _abstract(jax.eval_shape(functools.partial(
      model.init_cache, model_cfg, slots, max_length)), cache_shardings)
  rep = placement.replicated
  i32, f32 = jnp.int32, jnp.float32
  # The engine's prefill attends as JaxEngine's prefill_attention says (its default), on
  # the target's platform.
  prefill_cfg = prefill_lib.prefill_config(
      model_cfg, prefill_attention, platform=placement.mesh.devices.flat[0].platform)
  prefill_fn = jax.jit(functools.partial(prefill_lib.prefill_chunk, prefill_cfg),
                       donate_argnums=(1,), out_shardings=(cache_shardings, rep, rep, rep))
  decode_fn = jax.jit(functools.partial(decode_loop.decode_steps, model_cfg, decode_steps),
                      donate_argnums=(1,),
                      out_shardings=(cache_shardings, rep, rep, rep, rep))
  per_slot = lambda dtype: _scalar(dtype, rep, (slots,))
  with placement.scope():
    prefill_c = prefill_fn.lower(
        params, cache, _scalar(i32, rep), _scalar(i32, rep, (1, prefill)), _scalar(i32, rep),
        _scalar(i32, rep), _scalar(f32, rep), _scalar(i32, rep), _scalar(f32, rep),
        _scalar(jnp.uint32, rep)).compile()
    decode_c = decode_fn.lower(
        params, cache, per_slot(i32), per_slot(i32), per_slot(jnp.bool_), per_slot(jnp.bool_),
        per_slot(f32), per_slot(i32), per_slot(f32), per_slot(jnp.uint32),
        _scalar(i32, rep, (slots, 1)), per_slot(i32), _scalar(i32, rep)).compile()
  return {"prefill": prefill_c, "decode": decode_c}


def actor_placement(cfg, devices) -> engine_sharding.Placement:
  """An RL actor's engine mesh (config.actors.parallel, as the actor builds it) over the
  first of `devices` it uses: with an axis of -1, all of them; otherwise the first
  prod(sizes). Raises ConfigError naming the actors.parallel key that does not fit."""
  devices = list(devices)
  placement = engine_sharding.placement_from_config(
      cfg.actors.parallel, cfg.actors.slots, devices, prefix="actors.parallel.")
  if placement is None:  # one device: the actor runs without a mesh; plan it on one
    placement = engine_sharding.Placement(
        parallel_lib.make_mesh(cfg.actors.parallel.mesh, devices[:1]),
        parallel_lib.rules_of(cfg.actors.parallel))
  return placement


def engine_state_bytes(model_cfg, placement, *, slots: int, max_length: int,
                       weights_quant: str = "none") -> dict:
  """Per-device bytes the engine holds between calls: its weights (in the model's
  param_dtype, the routed experts quantised by `weights_quant`; by tensor group,
  c2jax.rollout.resident) and its KV cache of `slots` x `max_length`, with their dtypes."""
  def shard_bytes(tree, shardings):
    return sum(math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
               for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))
  params = jax.eval_shape(functools.partial(model.init, model_cfg), jax.random.key(0))
  params = resident.abstract_resident(
      _abstract(params, placement.param_shardings(model_cfg, params)), weights_quant)
  groups = resident.weight_groups(params)
  cache = jax.eval_shape(functools.partial(model.init_cache, model_cfg, slots, max_length))
  dtypes = lambda tree: sorted({str(x.dtype) for x in jax.tree.leaves(tree)})
  return {"weights_bytes": sum(g["bytes_per_device"] for g in groups.values()),
          "weights_dtypes": dtypes(params), "weight_groups": groups,
          "cache_bytes": shard_bytes(cache, placement.cache_shardings(model_cfg)),
          "cache_dtypes": dtypes(cache)}


def compile_engine_steps(cfg, devices, *, slots: int, context: int, prefill: int,
                         decode_steps: int = jax_engine.DEFAULT_MAX_DECODE_STEPS,
                         costed: bool = True, cost_attention: str = "as_configured",
                         placement: engine_sharding.Placement | None = None,
                         max_length: int | None = None,
                         weights_quant: str = "none") -> list[CompiledStep]:
  """The rollout engine's prefill (one slot, a chunk of `prefill` tokens) and decode
  (up to `decode_steps` tokens for `slots` slots at `context` tokens) programs on
  `devices`: the programs JaxEngine compiles (its decode call runs up to
  `max_decode_steps` tokens, the count of a call being a runtime operand); the decode
  program's cost figures and model FLOPs are one token step's (its loop body is costed
  once). `placement`: the engine's mesh (default: the
  job's `parallel` axes over `devices`, engine_placement; an RL actor's: actor_placement).
  `max_length`: the KV cache's length (default: room for the context, a decode call and
  a prefill chunk; an actor's is actors.max_length). `weights_quant`: the routed experts
  held quantised (JaxEngine's; an actor's is actors.weights_quant)."""
  if placement is None:
    placement = engine_placement(cfg.parallel, list(devices), slots)
  devices = list(placement.mesh.devices.flat)
  max_length = max_length or context + decode_steps + prefill
  kwargs = dict(slots=slots, max_length=max_length, prefill=prefill, decode_steps=decode_steps,
                weights_quant=weights_quant)
  begun = time.perf_counter()
  as_configured = _compile_engine(cfg.model, placement, **kwargs)
  unrolled = cost_config(cfg, losses=False, attention=cost_attention) if costed else None
  # The cost compile of cost_attention 'dense' scores the prefill densely as well (the
  # engine's own prefill attention is 'auto'), even where the config is dense already.
  dense_cost = costed and cost_attention == "dense"
  costed = (as_configured if unrolled is None and not dense_cost else
            _compile_engine((unrolled or cfg).model, placement, **kwargs,
                            prefill_attention="dense" if dense_cost else "auto"))
  seconds = time.perf_counter() - begun
  n = len(devices)
  prefill_flops = roofline.train_flops_per_token(cfg.model, prefill) / 3 * prefill / n
  decode_flops = roofline.decode_step_cost(cfg.model, slots, context, n).model_flops
  return [
      CompiledStep(f"engine prefill (1 x {prefill} tokens)", as_configured["prefill"],
                   costed["prefill"], seconds / 2, prefill_flops, n),
      # The token loop's trip count is a runtime operand: XLA's cost analysis counts its
      # body once, so the decode call's estimate is one step's, and so are its FLOPs.
      CompiledStep(f"engine decode ({slots} slots x {decode_steps} steps, context "
                   f"{context}; costed per step)", as_configured["decode"],
                   costed["decode"], seconds / 2, decode_flops, n)]


def _cost(compiled) -> dict | None:
  analysis = compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, list) and analysis else analysis
  return analysis or None  # the GPU compiler's is empty for compile-only devices


def remaining_loops(hlo_text: str) -> int:
  """While loops in a compiled program's HLO (their bodies are costed once)."""
  return hlo_text.count(" while(")


def mosaic_calls(hlo_text: str) -> int:
  """Pallas kernels compiled through Mosaic (TPU) or Mosaic GPU in a compiled program."""
  return hlo_text.count('custom_call_target="tpu_custom_call"') + hlo_text.count(
      'custom_call_target="mosaic_gpu')


_OFFLOADED = re.compile(r"^\s*(?:ROOT )?%?\w+_offload_custom_fusion[\w.]* = ", re.M)


def offloaded_ops(hlo_text: str) -> int:
  """Gathers and scatters the TPU compiler moved to the SparseCore
  (`*_offload_custom_fusion`); its cost model gives them no estimate."""
  return len(_OFFLOADED.findall(hlo_text))


def time_estimate(cost: dict | None, hlo_text: str) -> tuple[float | None, str]:
  """(the compiler's time estimate, or None with why there is none)."""
  if cost is None:
    return None, "no cost analysis for compile-only devices"
  seconds = float(cost.get("optimal_seconds", 0.0))
  if seconds > 0:
    return seconds, ""
  offloaded = offloaded_ops(hlo_text)
  why = (f"; {offloaded} gather/scatter op(s) offloaded to the SparseCore carry no "
         "estimate (tools/compile/tpu_cost_breakdown.py lists them)" if offloaded else
         "; some op has no cost (an all-reduce of booleans is one)")
  return None, f"the cost model returned {seconds * 1e3:,.3f} ms, not an estimate{why}"


def step_report(step: CompiledStep, target: topologies.AnyTarget,
                costed: bool = True) -> dict:
  """The step's compiler estimates as one JSON-ready dict (see the module docstring).
  `costed=False`: the step was compiled without its cost compile (--notarget_cost), so
  the cost fields are None (the scanned step's own analysis would count one layer)."""
  chip = target.accelerator
  mem = memory_lib.memory_report(step.compiled)
  cost = _cost(step.cost_compiled) if costed else None
  seconds, estimate_note = time_estimate(cost, step.cost_hlo_text)
  if not costed and target.has_cost_model:
    estimate_note = "--notarget_cost: no cost compile"
  peak = chip.peak_flops("bfloat16")
  try:
    collectives, note = hlo_comms.summary(step.comm_volumes), ""
  except ValueError as err:  # a collective in a data-dependent loop (the decode loop's)
    collectives, note = None, str(err)
  return {
      "step": step.label, "compile_seconds": round(step.seconds, 1),
      "memory": memory_lib.summary(mem, chip.memory_gb),
      "fits": mem.fits(chip.memory_gb),
      "flops": None if cost is None else float(cost.get("flops", 0.0)),
      "bytes_accessed": None if cost is None else float(cost.get("bytes accessed", 0.0)),
      "model_flops": step.model_flops,
      "cost_model_seconds": seconds, "cost_model_note": estimate_note,
      "mfu_estimate": step.model_flops / (seconds * peak) if seconds else None,
      "loops_costed_once": remaining_loops(step.cost_hlo_text),
      "mosaic_calls": mosaic_calls(step.hlo_text),
      "sparsecore_offloads": offloaded_ops(step.cost_hlo_text),
      "collectives": collectives, "collectives_note": note}


def format_report(report: dict, target: topologies.AnyTarget) -> str:
  """A step's report as text: memory table, then the cost model's figures."""
  chip = target.accelerator
  m = report["memory"]
  rows = [(f"per device ({target.compiler} estimate)", "GB"),
          ("arguments", f"{m['argument_bytes'] / 1e9:,.3f}"),
          ("outputs", f"{m['output_bytes'] / 1e9:,.3f}"),
          ("  of which aliased to donated arguments", f"{m['alias_bytes'] / 1e9:,.3f}"),
          ("temporaries", f"{m['temp_bytes'] / 1e9:,.3f}"),
          ("generated code", f"{m['code_bytes'] / 1e9:,.3f}"),
          ("total", f"{m['total_bytes'] / 1e9:,.3f}")]
  verdict = "fits" if report["fits"] else "does NOT fit"
  kernels = f"; {report['mosaic_calls']} Pallas kernel call(s) through Mosaic" if report[
      "mosaic_calls"] else ""
  mfu = report["mfu_estimate"]
  lines = [
      f"{report['step']} (compiled in {report['compile_seconds']:.1f} s{kernels})",
      memory_lib.format_table(rows),
      f"{verdict} in {chip.name}'s {chip.memory_gb:g} GB HBM"]
  if report["flops"] is None:
    why = (f"the {target.compiler} gives none for compile-only devices"
           if not target.has_cost_model else "--notarget_cost: no cost compile")
    lines.append(f"model FLOPs {report['model_flops']:.4g} per device; no cost analysis "
                 f"({why})")
    return "\n".join(lines)
  lines.append(
      f"cost analysis: {report['flops']:.4g} FLOPs, {report['bytes_accessed']:.4g} bytes "
      f"accessed per device; model FLOPs {report['model_flops']:.4g}")
  if report["cost_model_seconds"] is None:
    lines.append(f"compiler's time estimate: none ({report['cost_model_note']})")
  else:
    lines.append(
        f"compiler's time estimate: {report['cost_model_seconds'] * 1e3:,.3f} ms per call "
        f"(an estimate, not a measured speed); MFU it implies at {chip.bf16_tflops:g} "
        f"TFLOP/s: " + ("-" if mfu is None else f"{mfu:.1%}"))
  if report["loops_costed_once"]:
    lines.append(f"({report['loops_costed_once']} while loop(s) remain after unrolling the "
                 "layers; XLA's cost analysis counts their bodies once)")
  return "\n".join(lines)
