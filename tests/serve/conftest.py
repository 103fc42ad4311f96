"""A tiny random model behind `c2jax serve`, plus a scripted engine for exact outputs.

Session-scoped: the JaxEngine's programs compile once. The reference greedy generations
are computed with the served engine itself before its server starts (the engine thread
owns it afterwards), so tests compare the server with the engine's own results.
"""

import time

import numpy as np
import pytest

from c2jax.data import chat
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.rollout import JaxEngine, Request, SamplingParams
from c2jax.rollout.engine import Engine, SlotOutput
from c2jax.serve import Running, Service
from c2jax.serve.validation import Limits
from tests.model.conftest import random_params, tiny_cfg

VOCAB = 320
MAX_LENGTH = 160
BUCKETS = (64, 128)
MAX_TOKENS = 10
MODEL = "tiny-test"
BODY_LIMIT = 64 * 2**20
USERS = [f"Question {i}: what does {w} do?" for i, w in
         enumerate(["ls", "grep", "sed", "awk", "git diff", "make", "cat -n", "pytest -x"])]
TEXTS = ["def main():\n    return parse(args)\n", "Please fix the failing test in src/app.py.",
         'The tool result says {"ok": true}. What now?'] * 50


def messages(user: str) -> list[dict]:
  return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": user}]


class ScriptedEngine(Engine):
  """Emits `script` token by token for every request (cycling), `delay` seconds per
  decode step; records every prompt it was given."""

  def __init__(self, script, num_slots=2, max_length=100_000, delay=0.0):
    super().__init__(num_slots=num_slots, max_length=max_length)
    self.script, self.delay = list(script), delay
    self.prompts = []
    self._position = {}

  def _next(self, slot):
    position = self._position[slot]
    self._position[slot] = position + 1
    return self.script[position % len(self.script)]

  def _append(self, slot, context, start, sampling, seed):
    self.prompts.append(list(context))
    self._position[slot] = 0
    return self._next(slot), -0.25, np.zeros((len(context) - start, 1, 2), np.int32)

  def _decode(self, batch):
    time.sleep(self.delay)
    return {int(s): SlotOutput(np.int32([self._next(int(s))]), np.float32([-0.25]),
                               np.full((1, 1, 2), 3, np.int32))
            for s in np.flatnonzero(batch.active)}

  def _set_params(self, params):
    pass

  def logprobs(self, sequences):
    raise NotImplementedError

  def free_slots(self) -> int:
    return len(self._free)


class Served:
  def __init__(self, tmp_dir):
    self.tokenizer = tokenizer_lib.train_bpe(TEXTS, VOCAB - 8)
    assert self.tokenizer.vocab_size <= VOCAB
    self.cfg = tiny_cfg(vocab_size=VOCAB, num_layers=2)
    self.params = random_params(self.cfg)
    # As `c2jax serve` builds it: 8-token decode calls, so streams arrive in pieces.
    self.engine = JaxEngine(self.cfg, self.params, num_slots=4, max_length=MAX_LENGTH,
                            prefill_buckets=BUCKETS, detokenize=self.tokenizer.decode,
                            version=7, max_decode_steps=8)
    self.prompts = [chat.render(self.tokenizer, messages(u), add_generation_prompt=True).ids
                    for u in USERS]
    stops = (self.tokenizer.token_id("<|end|>"), self.tokenizer.eos_id)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_tokens=stops)
    self.reference = self.engine.generate([Request(p, greedy) for p in self.prompts])
    self.teacher = self.engine.logprobs(
        [np.concatenate([p, g.tokens]) for p, g in zip(self.prompts, self.reference)])
    self.capture = tmp_dir / "capture.jsonl"
    # A body limit above 50 MB, so test_serve_hostile can send a 50 MB prompt that is
    # read in full (and refused by its length, not its size).
    self.running = Running(Service(self.engine, self.tokenizer, MODEL,
                                   vocab_size=VOCAB, capture_path=str(self.capture),
                                   limits=Limits(max_body_bytes=BODY_LIMIT)))


@pytest.fixture(scope="session")
def served(tmp_path_factory):
  served = Served(tmp_path_factory.mktemp("serve"))
  yield served
  served.running.stop()


@pytest.fixture(scope="session")
def client(served):
  openai = pytest.importorskip("openai")
  return openai.OpenAI(base_url=served.running.base_url, api_key="none", max_retries=0,
                       timeout=60)
