"""Shared fixtures: a tiny model, a small BPE tokenizer and a little repository."""

import pathlib

import jax
import pytest

from c2jax import model
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.model import variants

from evalbase_testlib import REPO, write_repo


@pytest.fixture(scope="session")
def repo(tmp_path_factory) -> pathlib.Path:
  return write_repo(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="session")
def tok() -> tokenizer_lib.Tokenizer:
  texts = [v for v in REPO.values() if isinstance(v, str)] * 10
  texts += ["def f(a, b):\n  x = a + b\n  return x\n"] * 10
  return tokenizer_lib.train_bpe(texts, 320)


@pytest.fixture(scope="session")
def tiny():
  cfg = variants.get("tiny")
  return cfg, jax.jit(lambda key: model.init(cfg, key))(jax.random.key(0))
