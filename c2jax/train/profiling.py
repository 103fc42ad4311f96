"""Profiling (config.profile): a `jax.profiler` trace of chosen steps, and host spans.

    --config.profile.steps='(3, 5)'    trace steps 3..5 (inclusive); () is off (default)
    --config.profile.python_tracer=True  also record every Python call (a far larger trace,
                                         slow to write; off by default)

Each process writes its own trace under the run directory, WORKDIR/profile/<process>
(`process_0`, ... for pretrain/SFT; `learner` and `actor0`, ... for RL; `serve` for the
server, whose steps are engine steps): TensorBoard's profile plugin reads it
(`tensorboard --logdir WORKDIR/profile/learner`), and the `perfetto_trace.json.gz` beside it
opens in Perfetto (ui.perfetto.dev). RL actors trace the rollouts they make with the
policy versions those learner steps start from (a-1 .. b-1), so the learner's and the
actors' traces cover the same stretch of the run.

Host spans (`span(name)`, a `jax.profiler.TraceAnnotation`) mark the phases on the
host's timeline: train/data, train/step, train/checkpoint, train/eval; learner/wait
(the queue), learner/step, learner/publish, learner/checkpoint, learner/eval; actor/weights,
actor/rollout, actor/queue; serve/step. They cost nothing while no trace is running.
`span_totals(logdir)` reads them back from a trace: {name: (count, total ms)}.
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib

import jax
import ml_collections

from c2jax import config as configlib


def default_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(steps=(), python_tracer=False))


def steps_of(profile_cfg, prefix: str = "profile.") -> tuple[int, int] | None:
  """(first, last) traced step, or None when profiling is off; raises ConfigError for a
  malformed value."""
  steps = tuple(profile_cfg.steps or ())
  if not steps:
    return None
  if (len(steps) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
      or not 1 <= steps[0] <= steps[1]):
    raise configlib.ConfigError(
        f"{prefix}steps", f"= {steps!r}; use two step numbers (first, last) with "
        "1 <= first <= last, e.g. --config.profile.steps='(3, 5)', or () for no trace.")
  return steps


def validate(profile_cfg, prefix: str = "profile.") -> None:
  configlib.check_keys(profile_cfg, default_config(), prefix)
  steps_of(profile_cfg, prefix)


def trace_of(profile_cfg, logdir: str | pathlib.Path) -> "StepTrace":
  """The StepTrace a job's config.profile asks for, writing under `logdir`."""
  return StepTrace(steps_of(profile_cfg), logdir,
                   python_tracer=bool(profile_cfg.get("python_tracer", False)))


def span(name: str):
  """A named host-side span on the trace's timeline (a context manager)."""
  return jax.profiler.TraceAnnotation(name)


class StepTrace:
  """Starts a trace before step `first` and stops it after step `last` (or at close).

  Call `before(step)` as a step begins and `after(step, outputs)` when it has been
  dispatched: the trace stops only once `outputs` are ready, so it holds the device work
  of its last step too. Steps need not arrive one by one (a resumed run may start inside
  the window; a server counts engine steps): the trace runs while first <= step <= last.
  """

  def __init__(self, steps: tuple[int, int] | None, logdir: str | pathlib.Path, *,
               python_tracer: bool = False):
    self.steps = steps
    self.logdir = pathlib.Path(logdir)
    self.python_tracer = python_tracer
    self.active = False
    self.done = False

  def before(self, step: int) -> None:
    if self.steps is None or self.active or self.done:
      return
    first, last = self.steps
    if first <= step <= last:
      self.logdir.mkdir(parents=True, exist_ok=True)
      options = jax.profiler.ProfileOptions()
      # Without the Python tracer the host timeline holds the spans and JAX's own events;
      # with it, every Python call too (many times the size: a process stopped soon after
      # may be killed before its trace is written).
      options.python_tracer_level = 1 if self.python_tracer else 0
      jax.profiler.start_trace(str(self.logdir), create_perfetto_trace=True,
                               profiler_options=options)
      self.active = True

  def after(self, step: int, outputs=None) -> None:
    if self.active and step >= self.steps[1]:
      self.close(outputs)

  def close(self, outputs=None) -> None:
    if not self.active:
      return
    if outputs is not None:
      jax.block_until_ready(outputs)
    jax.profiler.stop_trace()
    self.active, self.done = False, True
    print(f"profile: trace of steps {self.steps[0]}..{self.steps[1]} in {self.logdir}",
          flush=True)


SPAN_PREFIXES = ("train/", "learner/", "actor/", "serve/")


def span_totals(logdir: str | pathlib.Path) -> dict[str, tuple[int, float]]:
  """The host spans of the newest trace under `logdir` (one process's profile
  directory): {span name: (count, total milliseconds)}. Raises FileNotFoundError naming
  the directory when it holds no trace."""
  traces = sorted(pathlib.Path(logdir).glob("plugins/profile/*/perfetto_trace.json.gz"))
  if not traces:
    raise FileNotFoundError(f"No profile trace under {logdir} (expected "
                            "plugins/profile/<run>/perfetto_trace.json.gz).")
  with gzip.open(traces[-1], "rt") as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  totals = collections.defaultdict(lambda: [0, 0.0])
  for event in events:
    name = event.get("name", "")
    if event.get("ph") == "X" and name.startswith(SPAN_PREFIXES):
      totals[name][0] += 1
      totals[name][1] += float(event.get("dur", 0.0)) / 1e3
  return {name: (count, ms) for name, (count, ms) in sorted(totals.items())}
