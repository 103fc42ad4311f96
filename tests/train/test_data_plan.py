"""jobs.data_plan: the training data streams a process reads, and the errors that name a
resume the run's batches cannot survive, before anything is restored or compiled (the
multi-process cases run in tests/train/test_preemption_distributed.py)."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from c2jax import config as configlib
from c2jax.train import jobs


@pytest.fixture(scope="module")
def sharding():
  return NamedSharding(Mesh(np.array(jax.devices()[:1]), ("data",)), P("data"))


def _cfg(**train):
  cfg = jobs.job_defaults()
  cfg.train.update(train)
  return cfg


def test_a_new_run_has_one_stream_per_process_unless_set(sharding):
  assert jobs.data_plan(_cfg(), sharding, None) == jobs.DataPlan(1, (0,))
  assert jobs.data_plan(_cfg(data_streams=4), sharding, None) == jobs.DataPlan(4, (0, 1, 2, 3))
  assert jobs.process_rows(sharding, (8, 16)) == [(0, 8)]


def test_a_resume_keeps_the_checkpoint_s_streams(sharding):
  # Written by 2 processes, resumed by 1: this process reads both streams.
  assert jobs.data_plan(_cfg(), sharding, 2) == jobs.DataPlan(2, (0, 1))
  assert jobs.data_plan(_cfg(data_streams=2), sharding, 2) == jobs.DataPlan(2, (0, 1))
  with pytest.raises(configlib.ConfigError,
                     match=r"train.data_streams: is 4 but the run in runs/x started with 2"):
    jobs.data_plan(_cfg(data_streams=4), sharding, 2, where="runs/x")
  with pytest.raises(configlib.ConfigError,
                     match=r"train.batch_size: = 8 rows cannot be split into the run's 3"):
    jobs.data_plan(_cfg(batch_size=8), sharding, 3)


def test_validate_refuses_a_negative_stream_count():
  with pytest.raises(configlib.ConfigError, match="train.data_streams"):
    jobs.validate(_cfg(data_streams=-1))
