"""The one loop every updating job runs: pretraining and SFT (train/loop.py) and the RL
learner (rl/trainer.py). It owns the cadences; a job supplies what happens at them.

    with run_loop.preemptible(workdir, leader) as stop:
      ...  # set-up that a SIGTERM should not kill (e.g. starting RL actors)
      end = run_loop.run(cadence, hooks, stop, start=step, late=late, trace=trace,
                         run_dir=workdir, checkpoint_dir=ckpt.directory, leader=...)

Per step s (from start + 1 to cadence.steps):
  trace.before(s); batch = hooks.take_batch(s, stop); outputs = hooks.step(s, batch)
  checkpoint  after s % checkpoint_every == 0, the last step, or a step a stop request
              (SIGTERM / SIGINT, c2jax.preemption) ends on; the late metrics are read
              first, so a non-finite loss stops the run before its step is saved
  log         after s % log_every == 0 and the last step (0: never)
  eval        after s % eval_every == 0 and the last step (0: never; and at step 0 with
              eval_at_start when the run starts from scratch); late metrics read first
  trace.after(s, outputs): the step's checkpoint and eval are in its trace window
A stop request ends the run after its step's checkpoint; `take_batch` may instead return
None when the request came while it waited for data (the RL learner's queue): the loop
then saves the last step unless it is saved already. Process 0 then marks the run
directory as preempted (c2jax.preemption.mark) and says how to resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from c2jax import preemption


@dataclasses.dataclass(frozen=True)
class Cadence:
  """When the hooks run: after every step that is a multiple of the period, and after the
  last step (`steps`); a period of 0 never runs that hook."""
  steps: int
  checkpoint_every: int
  eval_every: int = 0
  log_every: int = 0
  eval_at_start: bool = False

  def due(self, period: int, step: int) -> bool:
    return bool(period) and (step % period == 0 or step == self.steps)


@dataclasses.dataclass
class Hooks:
  """What a job does at the loop's points. take_batch(step, stop) -> the step's batch,
  or None if `stop` was requested while waiting for it; step(step, batch) -> outputs the
  profile trace waits on (the new state); save(step); evaluate(step); log(step)."""
  take_batch: Callable[[int, preemption.StopRequest], Any]
  step: Callable[[int, Any], Any]
  save: Callable[[int], None]
  evaluate: Callable[[int], None] = lambda step: None
  log: Callable[[int], None] = lambda step: None


@dataclasses.dataclass(frozen=True)
class End:
  step: int                 # the last step run (where a stop request ended the run)
  preempted: int | None     # that step when a stop request ended the run, else None


@contextlib.contextmanager
def preemptible(run_dir, leader: bool) -> Iterator[preemption.StopRequest]:
  """SIGTERM / SIGINT become a stop request (several processes agree on the step) from
  here until the block ends; process 0 first clears the run's old preemption mark."""
  if leader:
    preemption.clear(run_dir)
  stop = preemption.StopRequest(jax_processes=True).install()
  try:
    yield stop
  finally:
    stop.uninstall()


def run(cadence: Cadence, hooks: Hooks, stop: preemption.StopRequest, *, start: int, late,
        trace, run_dir, checkpoint_dir, leader: bool, saved: int | None = None,
        who: str = "") -> End:
  """Runs steps start + 1 .. cadence.steps. `stop`: preemptible's request; `late`: the
  job's runtime.LateMetrics (read at checkpoints, evals and the end); `trace`: its
  profiling.StepTrace (closed here); `run_dir`: where process 0 writes the preemption
  mark; `checkpoint_dir`: named in the resume message; `saved`: the step of the
  checkpoint the run resumed from (not saved again); `who`: the stopped part in that
  message ('the learner ')."""
  step, preempted = start, None

  def save():
    nonlocal saved
    late.flush()  # a non-finite loss stops the run before this step is saved
    hooks.save(step)
    saved = step

  try:
    if cadence.eval_at_start and cadence.eval_every and start == 0:
      hooks.evaluate(0)  # the starting point of every curve
    while step < cadence.steps:
      trace.before(step + 1)
      batch = hooks.take_batch(step + 1, stop)
      if batch is None:  # stopped while waiting for data: nothing new to train
        if saved != step:
          save()
        preempted = step
        break
      outputs = hooks.step(step + 1, batch)
      step += 1
      stopping = stop.reached(step)  # every process calls it once per step
      if cadence.due(cadence.checkpoint_every, step) or stopping:
        save()
      if cadence.due(cadence.log_every, step):
        hooks.log(step)
      if cadence.due(cadence.eval_every, step):
        late.flush()
        hooks.evaluate(step)
      trace.after(step, outputs)
      if stopping and step < cadence.steps:
        preempted = step
        break
    late.flush()
    if preempted is not None and leader:
      preemption.mark(run_dir, step=step)
      print(f"preemption: {who}stopped after step {step} with a checkpoint in "
            f"{checkpoint_dir}; rerun the same command to resume", flush=True)
  finally:
    trace.close()
  return End(step, preempted)
