"""Fixtures of the agent-loop tests: a procgen task, the scripted solver's transcript of
it, and a small BPE tokenizer trained on that transcript."""

import pytest

from c2jax.agent import config as agent_config
from c2jax.agent import prompt as prompt_lib
from c2jax.agent import solver
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.env import procgen


@pytest.fixture(scope="module")
def solved_task(tmp_path_factory):
  """A procgen task and the scripted solver's transcript of fixing it."""
  task = procgen.generate(str(tmp_path_factory.mktemp("repos")), seed=3, difficulty=1)
  [trace] = solver.solve_suite([task])
  return task, trace["messages"]


@pytest.fixture(scope="module")
def tokenizer(solved_task):
  _, messages = solved_task
  texts = [m.get("content") or "" for m in messages] * 4
  texts += [prompt_lib.system_message(agent_config.SYSTEM_PROMPT, [])] * 4
  return tokenizer_lib.train_bpe(texts, 400)
