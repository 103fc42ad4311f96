"""`c2jax rl`: the learner loop, with its actors, queue, weight publishing and evals.

    summary = train(cfg, workdir)

Per step: take `learner.groups_per_step` finished groups from the queue (each within
`rl.queue.max_lag` versions of the learner), pack their segments into one batch, run the
jitted `rl_step`, record the groups as trained at this step, publish the new weights (a
delta) for the actors, checkpoint. The learner runs on the shared training runtime
(c2jax.rl.learner.runtime): sharded as config.parallel says, metrics read one step late,
a non-finite loss stops the run naming the step before anything is saved. Time spent
waiting for groups is the learner's idle time. Held-out evaluation (pass rate,
best-of-k) runs at step 0 and every `eval.every` steps with the learner's own engine.
With a running curriculum (config.rl.curriculum.sampling = 'running') the learner also
folds each step's groups into the curriculum's statistics, keeps the pool filled with
prompts drawn by them, and checkpoints them with the parameters
(c2jax.rl.tasks.curriculum_pool).

Multi-process (config.parallel.distributed, c2jax.parallel.distributed): start the same
command once per process. Process 0 leads: it owns the run directory, the task pool, the
queue, the actors, the weight publisher, the metrics and the evals. Every process
restores, steps and checkpoints its shards of the state; process 0 broadcasts each
step's packed batch, and the new parameters are gathered to it once to be published.

Rerunning the same command resumes: the newest readable checkpoint gives the step and
state; groups trained after it go back to the queue (`GroupQueue.recover`), prompts
leased to actors of the previous run go back to the pool, and weights are republished
to a fresh directory, so no finished group is lost or trained twice.

SIGTERM or SIGINT (c2jax.preemption) stops the learner after the step in flight (or, on
a single process, at once while it waits for groups): it checkpoints that step, stops
the actors (their leased prompts go back to the pool; the queue is on disk) and returns
with `preempted` set, so the command exits 0 and rerunning resumes exactly. Several
learner processes agree on the step through JAX's preemption sync point. The actors are
checked every `actors.check_every_s` seconds whatever the queue holds
(c2jax.rl.actors.backends).

Process 0's side (the run's tasks, pool and queue, the actors, weight publishing, metrics,
evals) is c2jax.rl.leader. The loop's cadences (checkpoint, eval, profile window,
preemption) are c2jax.train.run_loop's, shared with pretraining and SFT; this module
supplies the learner's batch, step (with its weight publishing), checkpoint and eval. `config.profile.steps` traces learner steps (and the actors'
rollouts for them) under WORKDIR/profile (c2jax.train.profiling).
"""

from __future__ import annotations

import contextlib
import json
import pathlib

import jax
import numpy as np

from c2jax.parallel import distributed
from c2jax.rl import job
from c2jax.rl import leader as leader_lib
from c2jax.rl.actors import rollouts
from c2jax.rl.learner import runtime as learner_runtime
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import model_source, profiling, run_loop, runtime

class LeaderStoppedError(RuntimeError):
  """Process 0 of a multi-process learner stopped; the others stop with it."""


def _on_leader(work):
  """work() on process 0; if it fails, the other processes, which wait in the next
  batch broadcast meanwhile, are told to stop instead of waiting there for ever."""
  try:
    return work()
  except BaseException:
    if jax.process_count() > 1:
      distributed.broadcast_arrays(None)
    raise


_PREEMPTED = "__preempted__"  # the batch the leader sends when stopped while waiting


def _next_batch(lead, step: int, batch_ways: int, stop):
  """The step's batch on every process: process 0 takes the groups and packs them, the
  others receive them; None on every process when the leader was stopped by a signal
  while it waited for groups."""
  batch = None
  if lead is not None:
    batch = _on_leader(lambda: lead.take_batch(step, batch_ways, stop))
    if batch is None:
      batch = {_PREEMPTED: np.ones((), np.int32)}
  batch = distributed.broadcast_arrays(batch)
  if batch is None:
    raise LeaderStoppedError(f"rl: process 0 stopped at step {step}; its output says why.")
  return None if _PREEMPTED in batch else batch


def train(cfg, workdir) -> dict:
  """Runs (or resumes) the RL job in `workdir`; returns a summary.

  With several jax.distributed processes (config.parallel.distributed, or the JAX_*
  environment variables) every process calls this with the same config and workdir:
  process 0 leads (run directory, task pool, queue, actors, weight publishing, metrics,
  evals); every process restores, steps and checkpoints the sharded state, on the batch
  process 0 broadcasts."""
  # Multi-process learners join here, before anything asks JAX for its devices.
  distributed.initialize(cfg.parallel.distributed)
  # The policy's model is the one its init_from checkpoint trained (declared changes aside).
  cfg = model_source.resolve(cfg)
  job.validate(cfg, jax.device_count())
  dirs = rollouts.RunDirs(pathlib.Path(workdir).absolute())
  # A changed policy model on resume is named before anything is built or compiled.
  model_source.check_resume(cfg, rollouts.checkpoint_location(cfg, dirs))
  run = leader_lib.Run(cfg, workdir) if distributed.is_leader() else None
  rt = learner_runtime.build(cfg)
  checkpointer = checkpoint_lib.Checkpointer(rollouts.checkpoint_location(cfg, dirs),
                                             keep=cfg.learner.keep_checkpoints,
                                             every=cfg.learner.checkpoint_every)
  distributed.PeerWatch.resume_hint = lambda: (
      f"The last checkpoint is step {max(checkpointer.steps(), default=0)} in "
      f"{checkpointer.directory}: rerun the same command to resume from it.")
  step, state, ref_params, restored = learner_runtime.start(rt, checkpointer)
  if run is not None:
    if restored is not None:
      print(f"rl: resuming from step {step}"
            + (f" ({jax.process_count()} learner processes)" if jax.process_count() > 1
               else ""), flush=True)
    leader_lib.recover(run, step, restored)
  lead = None
  trace = profiling.trace_of(
      cfg.profile, dirs.root / "profile" / ("learner" if jax.process_count() == 1
                                            else f"learner_{jax.process_index()}"))
  # A signal from here on (while the actors start, too) stops the run with a checkpoint.
  with contextlib.ExitStack() as closing:
    stop = closing.enter_context(run_loop.preemptible(dirs.root, run is not None))
    closing.callback(checkpointer.close)
    closing.callback(trace.close)  # when the loop never started (it closes the trace)
    host = distributed.gather_for_leader(state.params)
    if run is not None:
      lead = _on_leader(lambda: leader_lib.Lead(
          cfg, run, step, host, restored[2][0] if restored is not None else None))
      closing.callback(lead.close)  # first: stops the actors
    step_fn = learner_runtime.make_step(rt)
    late = runtime.LateMetrics(
        lead.report if lead is not None else lambda at_step, metrics, extra: None,
        lambda at_step: (
            f"The last good checkpoint is step {max(checkpointer.steps(), default=0)} in "
            f"{checkpointer.directory}. Lower config.learner.learning_rate or check the "
            "rewards and advantages, then rerun."))
    if lead is not None:
      _on_leader(lead.start)

    def take_batch(next_step, stop):
      return _next_batch(lead, next_step - 1, rt.batch_ways(), stop)

    def run_step(next_step, batch):
      nonlocal state, host
      with rt.scope(), profiling.span("learner/step"):
        state, step_metrics = step_fn(state, ref_params, rt.place(batch))
      host = distributed.gather_for_leader(state.params)
      late.push(next_step, step_metrics, lead.trained(next_step) if lead is not None else {})
      if lead is not None:
        with profiling.span("learner/publish"):
          lead.publisher.publish(host, next_step)
      return state

    def save(at_step):
      with profiling.span("learner/checkpoint"):
        # Only process 0 writes the JSON data slot (orbax), so the others pass {}.
        checkpointer.save(at_step, state, lead.data_state() if lead is not None else {},
                          {"config": json.loads(cfg.to_json())}, force=True)

    def evaluate(at_step):
      if lead is not None:
        with profiling.span("learner/eval"):
          lead.evaluate(host, at_step)

    cadence = run_loop.Cadence(steps=cfg.learner.steps,
                               checkpoint_every=cfg.learner.checkpoint_every,
                               eval_every=cfg.eval.every)
    end = run_loop.run(cadence, run_loop.Hooks(take_batch, run_step, save, evaluate), stop,
                       start=step, late=late, trace=trace, run_dir=dirs.root,
                       checkpoint_dir=checkpointer.directory, leader=run is not None,
                       saved=step if restored is not None else None, who="the learner ")
    step, preempted = end.step, end.preempted
    distributed.stop_peer_watch()
  if lead is None:
    return {"step": step, "process": jax.process_index(), "preempted": preempted}
  return {**lead.summary(step), "preempted": preempted}
