"""Shared fixtures: a tiny synthetic source tree, its corpus and a tokenizer trained on it."""

import pathlib

import pytest

from c2jax.data import corpus, reader, tokenizer
from data_testlib import options, write_tree


@pytest.fixture(scope="session")
def tree(tmp_path_factory) -> pathlib.Path:
  return write_tree(tmp_path_factory.mktemp("tree"))


@pytest.fixture(scope="session")
def built(tree, tmp_path_factory) -> reader.Corpus:
  out = tmp_path_factory.mktemp("corpus")
  corpus.build(out, options(tree), progress=False)
  return reader.Corpus(out)


@pytest.fixture(scope="session")
def tok(built) -> tokenizer.Tokenizer:
  texts = list(built.texts("train")) * 20
  return tokenizer.train_bpe(texts, 320)
