"""Helpers shared by the agent-loop tests (test_agent_loop, test_agent_context): a
scripted engine, agent configs, and a small task with the turns that solve it."""

import json

import numpy as np

from c2jax.agent import config as agent_config
from c2jax.data import chat
from c2jax.env import tasks as tasks_lib
from c2jax.rollout.engine import Engine, SlotOutput

LAYERS, TOP_K = 1, 2


class ScriptedEngine(Engine):
  """Samples scripted turns: the i-th request on the n-th new sequence emits
  script[n][i] token by token (logprob -0.5 each), whatever the context."""

  def __init__(self, script, max_length=2048):
    super().__init__(num_slots=2, max_length=max_length)
    self.script, self.sequences = script, 0
    self.contexts = []  # the context of every request, as the engine saw it
    self._slot = {}

  def _next(self, slot):
    sequence, turn, pos = self._slot[slot]
    tokens = self.script[sequence][turn]
    self._slot[slot] = (sequence, turn, pos + 1)
    return int(tokens[min(pos, len(tokens) - 1)])

  def _append(self, slot, context, start, sampling, seed):
    if start == 0:
      self._slot[slot], self.sequences = (self.sequences, -1, 0), self.sequences + 1
    sequence, turn, _ = self._slot[slot]
    self._slot[slot] = (sequence, turn + 1, 0)
    self.contexts.append(list(context))
    routing = np.zeros((len(context) - start, LAYERS, TOP_K), np.int32)
    return self._next(slot), -0.5, routing

  def _decode(self, batch):
    return {int(s): SlotOutput(np.int32([self._next(int(s))]), np.float32([-0.5]),
                               np.ones((1, LAYERS, TOP_K), np.int32))
            for s in np.flatnonzero(batch.active)}

  def _set_params(self, params):
    pass

  def logprobs(self, sequences):
    raise NotImplementedError


def assistant_runs(rendered):
  """The token runs the model produced in a rendered conversation (one per turn)."""
  runs, current = [], []
  for token, trained in zip(rendered.ids.tolist(), rendered.loss_mask.tolist()):
    if trained:
      current.append(token)
    elif current:
      runs.append(current)
      current = []
  return runs + ([current] if current else [])


def agent_cfg(**overrides):
  cfg = agent_config.default_config()
  cfg.temperature = 0.0
  cfg.update(overrides)
  agent_config.validate(cfg)
  return cfg


def small_task(tmp_path):
  repo = tmp_path / "repo"
  (repo / "pkg").mkdir(parents=True)
  (repo / "pkg" / "flag.py").write_text("DONE = False\n")
  return tasks_lib.Task(id="flag", repo=str(repo), prompt="Set DONE to True in pkg/flag.py.",
                        test_command="grep -q 'DONE = True' pkg/flag.py",
                        fail_to_pass=["flag"])


def turn(tokenizer, content, calls):
  """Token ids of an assistant turn as the chat template renders it (with <|end|>)."""
  message = {"role": "assistant", "content": content, "tool_calls": [
      {"id": f"c{i}", "type": "function",
       "function": {"name": n, "arguments": json.dumps(a)}}
      for i, (n, a) in enumerate(calls)]}
  rendered = chat.render(tokenizer, [{"role": "user", "content": "x"}, message])
  return assistant_runs(rendered)[0]


def fix_turn(tokenizer):
  return turn(tokenizer, "", [("edit_file", {"path": "pkg/flag.py",
                                              "old_string": "DONE = False",
                                              "new_string": "DONE = True"}),
                               ("finish", {"message": "done"})])
