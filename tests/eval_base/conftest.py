"""Shared fixtures: a tiny model, a small BPE tokenizer and a little repository."""

import pathlib

import jax
import pytest

from c2jax import model
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.model import variants

REPO = {
    "b/util.py": "def clamp(x, lo, hi):\n  return max(lo, min(x, hi))\n",
    "a/main.py": "from b.util import clamp\n\nprint(clamp(5, 0, 3))\n",
    "README.md": "# demo\nA tiny repository.\n",
    "vendor/lib.py": "VENDORED = True\n",
    "logo.png": b"\x89PNG\r\n\x1a\n\0\0binary",
    "notes.txt": "not code\n",
    "empty.py": "\n  \n",
}


def write_repo(root: pathlib.Path, files=None) -> pathlib.Path:
  for path, content in (REPO if files is None else files).items():
    full = root / path
    full.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
      full.write_bytes(content)
    else:
      full.write_text(content, encoding="utf-8")
  return root


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
  return cfg, model.init(cfg, jax.random.key(0))
