"""Infrastructure failures are not rewards: the actor's per-prompt step with a sandbox
factory that crashes (retry on a fresh sandbox, drop the group, return the prompt,
count infra_failures) and with an engine that fails."""

import numpy as np
import pytest

from c2jax.agent import config as agent_config
from c2jax.agent import prompt as prompt_lib
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.env import sandbox as sandbox_lib
from c2jax.rl.actors import actor
from c2jax.rl.actors import infra
from c2jax.rl.actors import rollouts
from c2jax.rollout import FakeEngine
from rl_testlib import flag_task_run


@pytest.fixture(scope="module")
def tokenizer():
  texts = [prompt_lib.system_message(agent_config.SYSTEM_PROMPT, [])] * 4
  return tokenizer_lib.train_bpe(texts + ["Set DONE to True in pkg/flag.py."] * 4, 300)


@pytest.fixture
def run(tmp_path, tokenizer):
  cfg, task, dirs, pool, queue = flag_task_run(tmp_path)
  cfg.agent.update(max_turns=1, max_turn_tokens=8)
  engine = FakeEngine(vocab_size=tokenizer.vocab_size, num_slots=2, max_length=2048)

  def step(factory, engine=engine):
    task_id, payload = pool.lease("actor0")
    return actor.roll_out_prompt(cfg, dirs, engine, tokenizer, pool, queue, "actor0",
                                 task_id, payload, sandbox_factory=factory)

  return dirs, pool, queue, step


def _factory(crash_first: int):
  """The first `crash_first` sandboxes cannot start (SandboxError); later ones work."""
  calls = []

  def make(task):
    calls.append(task.id)
    if len(calls) <= crash_first:
      raise sandbox_lib.SandboxError("the sandbox host rebooted")
    return sandbox_lib.make_sandbox("bubblewrap", task.repo)

  return make, calls


def test_a_crash_within_the_retries_still_queues_the_group(run):
  dirs, pool, queue, step = run
  factory, calls = _factory(crash_first=1)
  assert step(factory) == "queued"
  assert len(calls) == 3  # 2 rollouts + 1 fresh sandbox
  assert queue.counts()["ready"] == 1 and pool.counts()["done"] == 1
  assert infra.totals(dirs) == {"infra_failures": 0, "infra_retries": 1, "infra_dropped": 0}


def test_a_group_failing_beyond_its_retries_is_dropped_never_scored(run):
  dirs, pool, queue, step = run
  factory, calls = _factory(crash_first=100)
  assert step(factory) == "dropped"
  assert len(calls) == 4  # each of the 2 rollouts: first try + 1 retry
  assert sum(queue.counts().values()) == 0  # nothing reached the learner
  assert pool.counts() == {"pending": 1, "leased": 0, "done": 0}  # the prompt is back
  assert infra.totals(dirs) == {"infra_failures": 1, "infra_retries": 2, "infra_dropped": 0}
  # It fails again: prompt_returns = 1 is spent, so it is dropped for good.
  assert step(factory) == "dropped"
  assert pool.counts() == {"pending": 0, "leased": 0, "done": 1}
  assert infra.totals(dirs) == {"infra_failures": 2, "infra_retries": 4, "infra_dropped": 1}
  assert sum(queue.counts().values()) == 0


class _FailingEngine(FakeEngine):
  def _decode(self, batch):
    raise RuntimeError("the accelerator fell off the bus")


def test_an_engine_failure_drops_the_group_and_asks_for_a_restart(run, tokenizer):
  dirs, pool, queue, step = run
  factory, _ = _factory(crash_first=0)
  broken = _FailingEngine(vocab_size=tokenizer.vocab_size, num_slots=2, max_length=2048)
  assert step(factory, engine=broken) == "engine_error"
  assert sum(queue.counts().values()) == 0 and pool.counts()["pending"] == 1
  assert infra.totals(dirs)["infra_failures"] == 1


def test_counts_survive_and_sum_over_actors(tmp_path):
  dirs = rollouts.RunDirs(tmp_path)
  infra.record(dirs, "actor0", infra_failures=1)
  infra.record(dirs, "actor0", infra_retries=2)
  infra.record(dirs, "actor1", infra_failures=2, infra_dropped=1)
  assert infra.totals(dirs) == {"infra_failures": 3, "infra_retries": 2, "infra_dropped": 1}
  with pytest.raises(ValueError, match="Unknown infra counters"):
    infra.record(dirs, "actor0", failures=1)
  np.testing.assert_equal(infra.totals(rollouts.RunDirs(tmp_path / "none"))["infra_failures"], 0)
