"""RL job validation refuses sampling whose log-probs the learner cannot reproduce, and
summary triggers that leave no room for a summary."""

import pytest

from c2jax import config as configlib
from c2jax.rl import job


@pytest.mark.parametrize("key,value,message", [
    ("temperature", 0.0, "greedy"),
    ("top_k", 20, "top-k set"),
    ("top_p", 0.9, "nucleus"),
])
def test_unscorable_sampling_is_refused(key, value, message):
  cfg = job.job_defaults("tiny")
  cfg.agent[key] = value
  with pytest.raises(configlib.ConfigError, match=f"agent.{key}.*{message}"):
    job.validate(cfg)


def test_a_temperature_alone_is_accepted():
  cfg = job.job_defaults("tiny")
  cfg.agent.temperature = 0.6
  job.validate(cfg)


def test_a_summary_trigger_without_room_for_the_summary_is_refused():
  cfg = job.job_defaults("tiny")
  cfg.agent.context_management = "compaction"
  cfg.agent.summary_trigger_tokens = cfg.actors.max_length - 10
  with pytest.raises(configlib.ConfigError, match="agent.summary_trigger_tokens.*no room"):
    job.validate(cfg)
  cfg.agent.summary_trigger_tokens = cfg.actors.max_length // 2
  job.validate(cfg)
