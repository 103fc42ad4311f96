"""c2jax.train.profiling: the profile.steps setting, the trace window, host spans read
back from the trace (the jobs' traces are tested with them: test_loop, test_rl_curriculum_run,
test_serve_loading)."""

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from c2jax import config as configlib
from c2jax.rl import job as rl_job
from c2jax.train import jobs, profiling


@pytest.mark.parametrize("steps", [(3,), (0, 2), (5, 3), (1.5, 2), ("1", "2"), (True, 2),
                                   (1, 2, 3)])
def test_malformed_steps_name_the_key_and_the_fix(steps):
  cfg = ml_collections.ConfigDict(dict(steps=steps))
  with pytest.raises(configlib.ConfigError, match=r"profile\.steps.*1 <= first <= last"):
    profiling.validate(cfg)


def test_jobs_validate_their_profile_section():
  assert profiling.steps_of(jobs.job_defaults("tiny").profile) is None  # off by default
  cfg = jobs.job_defaults("tiny")
  cfg.profile.steps = (2, 1)
  with pytest.raises(configlib.ConfigError, match=r"profile\.steps"):
    jobs.validate(cfg)
  cfg = rl_job.job_defaults("tiny")
  cfg.profile.steps = (0, 1)
  with pytest.raises(configlib.ConfigError, match=r"profile\.steps"):
    rl_job.validate(cfg)


def test_trace_covers_exactly_the_window(tmp_path):
  """Steps 2..3 of 5: one trace, holding the spans of steps 2 and 3 and the device work
  of step 3 (the trace waits for its outputs); a resumed run starting inside the window
  (step 3) still traces."""
  step_fn = jax.jit(lambda x: jnp.sin(x) @ x)
  x = jnp.ones((64, 64))
  trace = profiling.StepTrace((2, 3), tmp_path / "run")
  for step in range(1, 6):
    trace.before(step)
    with profiling.span("train/step"):
      x = step_fn(x)
    trace.after(step, x)
  trace.close()
  assert trace.done and not trace.active
  assert profiling.span_totals(tmp_path / "run")["train/step"][0] == 2

  resumed = profiling.StepTrace((2, 3), tmp_path / "resumed")
  for step in (3, 4):
    resumed.before(step)
    with profiling.span("train/step"):
      x = step_fn(x)
    resumed.after(step, x)
  assert profiling.span_totals(tmp_path / "resumed")["train/step"][0] == 1
  with pytest.raises(FileNotFoundError, match="No profile trace under"):
    profiling.span_totals(tmp_path / "nothing")


def test_off_writes_nothing(tmp_path):
  trace = profiling.StepTrace(None, tmp_path / "off")
  for step in range(1, 4):
    trace.before(step)
    trace.after(step)
  trace.close()
  assert not (tmp_path / "off").exists()
