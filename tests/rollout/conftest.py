"""Shared tiny model, parameters, engines and teacher-forced reference for tests/rollout.

Session-scoped so the engines' prefill/decode programs compile once. A vocab of 16 keeps
greedy drafts from a random MTP module right often enough to exercise accepted drafts.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import model
from c2jax.model import mtp
from c2jax.rollout import JaxEngine
from tests.model.conftest import MLA_OVERRIDES, draw_params, random_params, tiny_cfg

VOCAB = 16
MAX_LENGTH = 48
BUCKETS = (16,)


def detokenize(ids) -> str:
  """A stand-in detokenizer: token i is the letter chr(ord('a') + i)."""
  return "".join(chr(ord("a") + int(i)) for i in ids)


class Setup:
  def __init__(self):
    self.cfg = tiny_cfg(vocab_size=VOCAB, num_layers=2, num_mtp_layers=1, **MLA_OVERRIDES)
    self.params = random_params(self.cfg)
    # Drawn on eval_shape's shapes (compiling the MTP init costs more than the test).
    # Seed 8 gives random MTP weights whose greedy drafts the main model accepts 4 times
    # over test_speculative's prompts (several seeds accept none), so multi-token steps
    # are exercised.
    self.params[mtp.PARAMS_KEY] = draw_params(
        jax.eval_shape(lambda: mtp.init(self.cfg, jax.random.key(1))), self.cfg.init_std, 8)
    self._apply = jax.jit(functools.partial(model.apply, self.cfg))

  def teacher(self, params, tokens):
    """(log-softmax [L, V], expert indices [L, Lm, K]) of one unpadded sequence."""
    padded = np.zeros((1, MAX_LENGTH), np.int32)
    padded[0, :len(tokens)] = tokens
    logits, aux, _ = self._apply(params, jnp.asarray(padded))
    logp = np.asarray(jax.nn.log_softmax(logits[0, :len(tokens)], axis=-1))
    return logp, np.asarray(aux["expert_indices"])[:, 0, :len(tokens)].transpose(1, 0, 2)

  def engine(self, **kwargs):
    params = kwargs.pop("params", self.params)
    return JaxEngine(self.cfg, params, num_slots=2, max_length=MAX_LENGTH,
                     prefill_buckets=BUCKETS, detokenize=detokenize, **kwargs)


@pytest.fixture(scope="session")
def setup() -> Setup:
  return Setup()


@pytest.fixture(scope="session")
def engine(setup) -> JaxEngine:
  # 8 tokens a call (the default is 64): several calls fit MAX_LENGTH, so weight swaps
  # and slot turnover land between calls mid-sequence.
  return setup.engine(max_decode_steps=8)


@pytest.fixture(scope="session")
def spec_engine(setup) -> JaxEngine:
  return setup.engine(num_draft_tokens=2)
