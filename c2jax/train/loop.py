"""The training loop around the pure `train_step`: data, mesh, checkpoints, metrics, eval.

    summary = loop.train(config, workdir)

It is resumable by construction: rerunning the same command after a kill restores the
newest readable checkpoint (TrainState + data-iterator state), truncates metrics.jsonl to
that step and continues the identical loss curve. Metrics are read one step late so the
host never stalls device dispatch, except at checkpoint steps, where the step's loss is
checked before anything is saved: a NaN/inf loss stops the run with the last good
checkpoint intact.

SIGTERM or SIGINT (a preemption notice, Ctrl-C) stops the run after the step in flight:
it writes a checkpoint of that step and returns with `preempted` set in the summary; with
several processes they agree on the step first (c2jax.preemption). Rerunning resumes it
exactly, as after any checkpoint. The cadences (checkpoint, log, eval, profile window,
preemption) are c2jax.train.run_loop's, which the RL learner shares; this module supplies
the job's data, step, checkpoint, log line and evals.
"""

from __future__ import annotations

import functools
import json
import math
import pathlib
import time

import jax
import numpy as np

from c2jax.data import packing, streams
from c2jax.parallel import context as context_lib
from c2jax.parallel import distributed
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import jobs, model_source, profiling, run_loop, runtime
from c2jax.train.init_params import initial_params
from c2jax.train.metrics import MetricsWriter
from c2jax.train.optimizer import make_optimizer
from c2jax.train.runtime import Runtime, abstract_state, init_state
from c2jax.train.step import MTPWeights, loss_fn, train_step


def build_runtime(cfg, devices=None) -> runtime.Runtime:
  """The runtime of a pretraining / SFT job: config validated against the devices (default
  all of this process's; `c2jax plan --target` passes compile-only ones), the optimizer of
  config.train (schedule, weight decay, precision policy)."""
  jobs.validate(cfg, jax.device_count() if devices is None else len(devices))
  t = cfg.train
  optimizer, _ = make_optimizer(
      learning_rate=t.learning_rate, total_steps=t.steps, warmup_steps=t.warmup_steps,
      schedule=t.schedule, weight_decay=t.weight_decay, b1=t.b1, b2=t.b2,
      clip_norm=t.clip_norm, end_lr_fraction=t.end_lr_fraction,
      state_dtype=cfg.model.opt_state_dtype)
  return runtime.build_runtime(cfg, optimizer=optimizer, seed=t.seed, devices=devices)


def device_batch(rt: Runtime, batch: dict) -> dict:
  """A host batch on the mesh; under context parallelism with load balancing, permuted
  along the sequence first (the loss is a masked sum over tokens, so it is unchanged)."""
  batch = {key: np.asarray(value) for key, value in batch.items() if key in jobs.BATCH_KEYS}
  shards = context_lib.num_shards(rt.mesh, rt.rules)
  if shards > 1 and rt.cfg.parallel.context_load_balance:
    batch = context_lib.balance_batch(batch, shards)
  return {key: jax.make_array_from_process_local_data(rt.batch_sharding, value)
          for key, value in batch.items()}


def make_train_step(rt: Runtime):
  return rt.jit_step(functools.partial(train_step, rt.cfg.model, rt.optimizer,
                                       mtp=MTPWeights.from_train_config(rt.cfg.train),
                                       microbatches=rt.cfg.train.microbatches,
                                       vocab_chunk=rt.cfg.train.loss_vocab_chunk,
                                       loss_impl=rt.cfg.train.loss_impl))


def make_eval_step(rt: Runtime):
  def eval_step(params, batch):
    _, stats = loss_fn(rt.cfg.model, params, batch,
                       MTPWeights.from_train_config(rt.cfg.train),
                       vocab_chunk=rt.cfg.train.loss_vocab_chunk,
                       loss_impl=rt.cfg.train.loss_impl)
    return stats["ce_loss"] * stats["tokens"], stats["tokens"]
  return jax.jit(eval_step, in_shardings=(rt.state_shardings.params, rt.batch_sharding))


def evaluate(rt: Runtime, eval_step, params, dataset, max_batches: int) -> float | None:
  """Mean per-token loss over up to `max_batches` batches of a finite dataset.

  With several processes each reads its own shard of the dataset, and shards can run out
  at different batches; the eval step is a collective every process must join, so they
  agree each round whether any shard has a batch left, and one whose shard is done feeds
  rows without loss tokens (they add nothing to the sums)."""
  total = count = 0.0
  batches = iter(dataset)
  with rt.scope():
    for _ in range(max_batches):
      batch = next(batches, None)
      if not distributed.any_process(batch is not None):
        break
      if batch is None:
        batch = packing.empty_rows(rt.cfg.train.batch_size // jax.process_count(),
                                   rt.cfg.train.seq_len)
      nll, tokens = eval_step(params, device_batch(rt, batch))
      total, count = total + float(nll), count + float(tokens)
  return total / count if count else None


def train(cfg, workdir: str | pathlib.Path) -> dict:
  """Runs (or resumes) a job to `cfg.train.steps`; returns a summary dict."""
  workdir = pathlib.Path(workdir).expanduser()
  workdir.mkdir(parents=True, exist_ok=True)
  # Multi-process runs join here, before anything asks JAX for its devices.
  distributed.initialize(cfg.parallel.distributed)
  # The model the checkpoint in init_from trained, with this phase's declared changes.
  cfg = model_source.resolve(cfg)
  # A changed model on resume is named here, before anything compiles or is restored.
  model_source.check_resume(cfg, workdir / "checkpoints")
  rt = build_runtime(cfg)
  t = cfg.train
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", keep=t.keep_checkpoints,
                                     every=t.checkpoint_every)
  # How the run's data was split (c2jax.data.streams) is read first, so a process count
  # that cannot continue its batches is named before anything is restored or compiled.
  saved = ckpt.data_states()
  saved = streams.merge(saved) if saved is not None else None
  plan = jobs.data_plan(cfg, rt.batch_sharding, saved["count"] if saved else None,
                        where=str(ckpt.directory))
  datasets = jobs.datasets(cfg, plan)
  (workdir / "config.json").write_text(cfg.to_json_best_effort(indent=2))
  with rt.scope():
    restored = ckpt.restore_latest(abstract_state(rt))
  iterator = iter(datasets.train)
  if restored is None:
    start, state = 0, initial_params(rt, init_state(rt))
  else:
    start, state, data_states = restored
    data_state = streams.merge(data_states)
    if data_state is None:
      raise checkpoint_lib.CheckpointRestoreError(
          f"checkpoint step {start} in {ckpt.directory} holds no data-iterator state, so "
          "the run cannot continue its data where it stopped; start a new workdir (or "
          "init_from it).")
    iterator.set_state(data_state)
    print(f"resume: step {start} from {ckpt.directory}"
          + (f" ({plan.count} data streams, this process reads {list(plan.held)})"
             if plan.count > 1 else ""), flush=True)
  # The leader's metrics are the run's; other processes keep theirs apart (same losses).
  writer = MetricsWriter(workdir if distributed.is_leader()
                         else workdir / f"process_{jax.process_index()}", resume_step=start,
                         metrics_cfg=cfg.metrics, config=cfg.to_dict())
  distributed.PeerWatch.resume_hint = lambda: (
      f"The last checkpoint is step {max(ckpt.steps(), default=0)} in {ckpt.directory}: "
      "rerun the same command, on these or other hosts, to resume from it.")
  step_fn, eval_step = make_train_step(rt), make_eval_step(rt)
  tokens_per_step = t.batch_size * t.seq_len
  begun, eval_rows = time.time(), []
  late = runtime.LateMetrics(
      lambda step, metrics, _: writer.write(step, metrics),
      lambda step: (f"The last good checkpoint is step {max(ckpt.steps(), default=0)} in "
                    f"{ckpt.directory}. Lower config.train.learning_rate or check the data, "
                    "then rerun."))

  trace = profiling.trace_of(cfg.profile,
                             workdir / "profile" / f"process_{jax.process_index()}")

  def take_batch(step, stop):
    del step, stop  # the data never makes the loop wait for a signal
    with profiling.span("train/data"):
      return device_batch(rt, next(iterator))

  def run_step(step, batch):
    nonlocal state
    with rt.scope(), profiling.span("train/step"):
      state, metrics = step_fn(state, batch)
    late.push(step, metrics)
    return state

  def save(step):
    with profiling.span("train/checkpoint"):
      ckpt.save(step, state, iterator.get_state(), cfg.to_dict(), force=True)

  def log(step):
    rate = (step - start) * tokens_per_step / (time.time() - begun)
    eta = (t.steps - step) * tokens_per_step / max(rate, 1e-9)
    shown = late.last.get("loss", float("nan"))
    print(f"step {step}/{t.steps}  loss {shown:.4f}  {rate:,.0f} tok/s  ETA {eta:,.0f}s",
          flush=True)

  def evals(step):
    with profiling.span("train/eval"):
      row = run_evals(rt, eval_step, state.params, datasets, step)
    eval_rows.append(writer.write(step, row))
    print("eval " + json.dumps({"step": step, **row}), flush=True)

  cadence = run_loop.Cadence(steps=t.steps, checkpoint_every=t.checkpoint_every,
                             eval_every=t.eval_every, log_every=t.log_every,
                             eval_at_start=True)
  leader = distributed.is_leader()
  try:
    with run_loop.preemptible(workdir, leader) as stop:
      end = run_loop.run(cadence, run_loop.Hooks(take_batch, run_step, save, evals, log),
                         stop, start=start, late=late, trace=trace, run_dir=workdir,
                         checkpoint_dir=ckpt.directory, leader=leader)
  finally:
    distributed.stop_peer_watch()
    ckpt.close()
    writer.close()
  preempted = end.preempted
  # `steps`: the step the run reached (the last one, or where a signal stopped it).
  return {"steps": t.steps if preempted is None else preempted,
          "final_loss": late.last.get("loss"), "evals": eval_rows,
          "workdir": str(workdir), "preempted": preempted}


def run_evals(rt: Runtime, eval_step, params, datasets, step: int) -> dict:
  row = {}
  for name, make_dataset in datasets.evals.items():
    value = evaluate(rt, eval_step, params, make_dataset(), rt.cfg.train.eval_batches)
    if value is not None:
      row[name] = value
      if name == "codebase_loss":
        row["codebase_perplexity"] = math.exp(min(value, 50.0))
  return row
