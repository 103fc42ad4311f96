"""c2jax.train.run_loop: the cadences pretraining, SFT and the RL learner share, checked
with a job of plain Python hooks (no model) and real signals."""

import os
import signal

import pytest

from c2jax import preemption
from c2jax.train import run_loop, runtime


class Job:
  """Records what the loop asks for, in order; `stop_at`: the step during which a SIGTERM
  arrives; `starve_at`: the step whose batch never comes (the RL queue is stopped)."""

  def __init__(self, nan_at=None, stop_at=None, starve_at=None):
    self.calls, self.nan_at, self.stop_at, self.starve_at = [], nan_at, stop_at, starve_at
    self.late = runtime.LateMetrics(lambda step, metrics, extra: self.calls.append(
        ("metrics", step)) or metrics)
    self.trace = Trace(self.calls)

  def hooks(self):
    return run_loop.Hooks(self.take_batch, self.step, lambda s: self.calls.append(("save", s)),
                          lambda s: self.calls.append(("eval", s)),
                          lambda s: self.calls.append(("log", s)))

  def take_batch(self, step, stop):
    if step == self.starve_at:
      os.kill(os.getpid(), signal.SIGTERM)
      assert stop.requested
      return None
    return {"step": step}

  def step(self, step, batch):
    assert batch == {"step": step}
    self.calls.append(("step", step))
    self.late.push(step, {"loss": float("nan") if step == self.nan_at else 1.0})
    if step == self.stop_at:
      os.kill(os.getpid(), signal.SIGTERM)
    return step


class Trace:
  def __init__(self, calls):
    self.calls = calls

  def before(self, step):
    self.calls.append(("trace", step))

  def after(self, step, outputs):
    assert outputs == step

  def close(self):
    self.calls.append(("trace_closed",))


def _run(job, tmp_path, cadence, start=0, saved=None):
  with run_loop.preemptible(tmp_path, leader=True) as stop:
    return run_loop.run(cadence, job.hooks(), stop, start=start, late=job.late,
                        trace=job.trace, run_dir=tmp_path, checkpoint_dir=tmp_path / "ckpt",
                        leader=True, saved=saved, who="the job ")


def _kinds(calls, *kinds):
  return [call for call in calls if call[0] in kinds]


def test_cadences_run_after_their_steps_and_the_last(tmp_path):
  job = Job()
  end = _run(job, tmp_path, run_loop.Cadence(steps=5, checkpoint_every=2, eval_every=3,
                                            log_every=2, eval_at_start=True))
  assert end == run_loop.End(step=5, preempted=None)
  assert _kinds(job.calls, "save", "eval", "log") == [
      ("eval", 0), ("save", 2), ("log", 2), ("eval", 3), ("save", 4), ("log", 4),
      ("save", 5), ("log", 5), ("eval", 5)]
  # A checkpoint and an eval read the step's metrics first; the trace closes at the end.
  assert job.calls.index(("metrics", 2)) < job.calls.index(("save", 2))
  assert job.calls.index(("metrics", 3)) < job.calls.index(("eval", 3))
  assert job.calls[-1] == ("trace_closed",) and not preemption.was_preempted(tmp_path)


def test_a_resumed_run_starts_after_its_step_and_skips_the_first_eval(tmp_path):
  job = Job()
  _run(job, tmp_path, run_loop.Cadence(steps=4, checkpoint_every=2, eval_every=2,
                                      eval_at_start=True), start=2)
  assert _kinds(job.calls, "step", "save", "eval") == [
      ("step", 3), ("step", 4), ("save", 4), ("eval", 4)]


def test_a_stop_request_checkpoints_its_step_and_marks_the_run(tmp_path, capsys):
  # What this process had before (SIG_DFL, or e.g. ray.init's handler left by a Ray test
  # that ran earlier in the same pytest worker).
  before = signal.getsignal(signal.SIGTERM)
  job = Job(stop_at=3)
  end = _run(job, tmp_path, run_loop.Cadence(steps=10, checkpoint_every=5, eval_every=5))
  assert end == run_loop.End(step=3, preempted=3)
  assert _kinds(job.calls, "step", "save", "eval") == [
      ("step", 1), ("step", 2), ("step", 3), ("save", 3)]
  assert preemption.was_preempted(tmp_path)
  assert (f"preemption: the job stopped after step 3 with a checkpoint in {tmp_path / 'ckpt'}"
          in capsys.readouterr().out)
  assert signal.getsignal(signal.SIGTERM) is before  # given back


def test_a_stop_while_waiting_for_data_saves_the_last_step_once(tmp_path):
  job = Job(starve_at=4)
  end = _run(job, tmp_path, run_loop.Cadence(steps=10, checkpoint_every=5))
  assert end == run_loop.End(step=3, preempted=3)
  assert _kinds(job.calls, "step", "save") == [("step", 1), ("step", 2), ("step", 3),
                                               ("save", 3)]
  job = Job(starve_at=3)  # step 2 is the checkpoint it resumed from: nothing to save
  end = _run(job, tmp_path, run_loop.Cadence(steps=10, checkpoint_every=5), start=2, saved=2)
  assert end.preempted == 2 and _kinds(job.calls, "save") == []


def test_a_non_finite_loss_stops_before_its_step_is_saved(tmp_path):
  job = Job(nan_at=2)
  with pytest.raises(runtime.NonFiniteLossError, match="at step 2"):
    _run(job, tmp_path, run_loop.Cadence(steps=4, checkpoint_every=2))
  assert _kinds(job.calls, "save") == [] and job.calls[-1] == ("trace_closed",)
