"""The engine policy: the agent loop on an engine, streamed into the runner.

A replay engine emits the scripted solver's turns (as the chat template tokenises them)
for whichever task's prompt it is given, so every episode solves its task and the token
counts are known exactly; a sandbox factory that fails once per task exercises the
infra-error path of run_episodes -> EnginePolicy -> runner retries.
"""

import json

import numpy as np
import pytest

from c2jax.agent import config as agent_config
from c2jax.agent import prompt as prompt_lib
from c2jax.data import chat
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.agent import solver
from c2jax.env import procgen, sandbox
from c2jax.eval import engine_policy, runner
from c2jax.rollout.engine import Engine, SlotOutput
from tests.agent.agent_testlib import assistant_runs

LAYERS, TOP_K = 1, 2


class ReplayEngine(Engine):
  """Sequence started from prompt P replays scripts[P] turn by turn, token by token."""

  def __init__(self, scripts, max_length=4096):
    super().__init__(num_slots=2, max_length=max_length)
    self.scripts, self._slot = scripts, {}

  def _next(self, slot):
    turns, turn, pos = self._slot[slot]
    self._slot[slot] = (turns, turn, pos + 1)
    return int(turns[turn][min(pos, len(turns[turn]) - 1)])

  def _append(self, slot, context, start, sampling, seed):
    if start == 0:
      self._slot[slot] = (self.scripts[tuple(context)], -1, 0)
    turns, turn, _ = self._slot[slot]
    self._slot[slot] = (turns, turn + 1, 0)
    return self._next(slot), -0.5, np.zeros((len(context) - start, LAYERS, TOP_K), np.int32)

  def _decode(self, batch):
    return {int(s): SlotOutput(np.int32([self._next(int(s))]), np.float32([-0.5]),
                               np.zeros((1, LAYERS, TOP_K), np.int32))
            for s in np.flatnonzero(batch.active)}

  def _set_params(self, params):
    pass

  def logprobs(self, sequences):
    raise NotImplementedError


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  tasks = procgen.generate_suite(str(tmp_path_factory.mktemp("repos")), 3, seed=7,
                                 difficulties=(0, 1))
  traces = solver.solve_suite(tasks)
  texts = [m.get("content") or "" for t in traces for m in t["messages"]] * 3
  tokenizer = tokenizer_lib.train_bpe(texts, 500)
  cfg = agent_config.default_config()
  cfg.temperature = 0.0
  scripts, sampled = {}, {}
  for task, trace in zip(tasks, traces):
    prompt = prompt_lib.prompt_ids(tokenizer, trace["messages"][0]["content"], task.prompt)
    # The finish turn's result is never fed back, so the rendering drops it (and <|eos|>).
    turns = assistant_runs(chat.render(tokenizer, trace["messages"]))
    scripts[tuple(prompt.tolist())] = turns
    sampled[task.id] = sum(len(t) for t in turns)
  return tasks, tokenizer, cfg, scripts, sampled


def test_engine_policy_streams_solved_episodes_with_token_counts(setup, tmp_path):
  tasks, tokenizer, cfg, scripts, sampled = setup
  policy = engine_policy.EnginePolicy(ReplayEngine(scripts), tokenizer, cfg, "replay")
  summary = runner.evaluate_tasks(policy, tasks, tmp_path, samples=2, ks=(1, 2),
                                  progress=False)
  overall = summary["overall"]
  assert overall["accuracy"] == 1.0 and overall["pass@2"] == 1.0
  assert overall["episodes"] == 6 and overall["infra_errors"] == 0
  for line in (tmp_path / "results.jsonl").read_text().splitlines():
    record = json.loads(line)
    assert record["completion_tokens"] == sampled[record["task_id"]]
    assert record["prompt_tokens"] > record["completion_tokens"] > 0
    assert record["finish_reason"] == "finish" and record["policy"] == "replay"


def test_sandbox_failures_become_infra_errors_and_are_retried(setup, tmp_path):
  tasks, tokenizer, cfg, scripts, _ = setup
  started = {}

  def flaky_factory(task):
    started[task.id] = started.get(task.id, 0) + 1
    if started[task.id] == 1:
      raise OSError("bubblewrap: cannot create the workspace")
    return sandbox.make_sandbox("bubblewrap", task.repo)

  policy = engine_policy.EnginePolicy(ReplayEngine(scripts), tokenizer, cfg, "replay",
                                      sandbox_factory=flaky_factory)
  overall = runner.evaluate_tasks(policy, tasks, tmp_path, samples=1, retries=1,
                                  retry_backoff_s=0.0, progress=False)["overall"]
  assert overall["accuracy"] == 1.0 and overall["infra_errors"] == 0
  assert set(started.values()) == {2}


def test_load_run_reads_an_hf_directory(tmp_path, setup):
  import jax

  from c2jax import model
  from c2jax.hf import convert
  from c2jax.model import variants

  _, tokenizer, _, _, _ = setup
  cfg = variants.get("tiny")
  params = model.init(cfg, jax.random.key(3))
  convert.save(cfg, params, tmp_path / "hf")
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    engine_policy.load_run(str(tmp_path / "hf"))
  tokenizer.save(tmp_path / "hf" / "tokenizer.json")
  loaded_cfg, loaded, loaded_tokenizer = engine_policy.load_run(str(tmp_path / "hf"))
  assert loaded_cfg.vocab_size == cfg.vocab_size and loaded_cfg.num_layers == cfg.num_layers
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32))
  assert loaded_tokenizer.encode("def f(): pass").tolist() == tokenizer.encode(
      "def f(): pass").tolist()


def test_a_prompt_longer_than_the_context_is_a_model_failure_not_infra(setup, tmp_path):
  tasks, tokenizer, cfg, scripts, _ = setup
  policy = engine_policy.EnginePolicy(ReplayEngine(scripts, max_length=64), tokenizer, cfg)
  overall = runner.evaluate_tasks(policy, tasks, tmp_path, samples=1, retries=3,
                                  progress=False)["overall"]
  assert overall["infra_errors"] == 0 and overall["accuracy"] == 0.0
  assert overall["finish_reasons"] == {"context": len(tasks)}
  records = [json.loads(l) for l in (tmp_path / "results.jsonl").read_text().splitlines()]
  assert {r["attempts"] for r in records} == {1}  # not retried
  assert "max_length = 64" in records[0]["extra"]["note"]
