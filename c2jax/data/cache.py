"""Build-once-then-cache of a corpus and its tokenizer, so training starts on a fresh machine.

`prepare(cache_dir, vocab_size=..., ...)` returns paths to a finished corpus and tokenizer,
building whatever is missing: the corpus directory is keyed by a hash of the build options
(and the interpreter, whose stdlib/site-packages the default sources read), the tokenizer
file by its vocabulary size and training budget. An interrupted build resumes on the next
call; a file lock keeps concurrent processes (several hosts or test workers sharing a cache)
from building the same corpus twice.

Configs carry the same fields as a ConfigDict (`default_config()`), so a training config
sets `config.data = data.default_config()` plus overrides and calls `prepare_from_config`.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import pathlib
import sys

import ml_collections

from c2jax.data import corpus, reader
from c2jax.data.sources import DEFAULT_SOURCES, NAMED_SOURCES
from c2jax.data.model_tokenizer import ModelTokenizer, load_model_tokenizer
from c2jax.data.tokenizer import Tokenizer, train_bpe


@dataclasses.dataclass(frozen=True)
class Prepared:
  corpus_dir: pathlib.Path
  tokenizer_path: pathlib.Path

  def corpus(self) -> reader.Corpus:
    return reader.Corpus(self.corpus_dir)

  def tokenizer(self) -> Tokenizer | ModelTokenizer:
    """c2jax's tokenizer, or a released model's (tokenizer_path is then its directory)."""
    if self.tokenizer_path.is_dir():
      return load_model_tokenizer(self.tokenizer_path)
    return Tokenizer.load(self.tokenizer_path)


def _resolved(spec: str) -> str:
  if spec in NAMED_SOURCES:
    return spec
  suffix = "/*" if spec.endswith("/*") else ""
  return str(pathlib.Path(spec.removesuffix("/*")).expanduser().resolve()) + suffix


def prepare(cache_dir: str | os.PathLike, *, vocab_size: int,
            sources: tuple[str, ...] | list[str] = DEFAULT_SOURCES,
            max_file_bytes: int = 256 * 1024, max_total_bytes: int | None = 64 * 2**20,
            heldout_fraction: float = 0.05, heldout_repositories: tuple[str, ...] = (),
            tokenizer_train_bytes: int = 8 * 2**20, tokenizer_file: str | None = None,
            tokenizer_dir: str | None = None, progress: bool = True) -> Prepared:
  """Corpus + tokenizer under `cache_dir`, built on first use (see the module docstring).

  tokenizer_file: an existing HF tokenizer.json to use instead of training a BPE.
  tokenizer_dir: a released model's directory (tokenizer.json or tiktoken.model,
    tokenizer_config.json, chat template): its tokenizer, template and tool-call format.
  """
  if tokenizer_file is not None and tokenizer_dir is not None:
    raise ValueError("data.tokenizer_file and data.tokenizer_dir are both set; set one "
                     "(tokenizer_dir for a released model with its chat template).")
  if tokenizer_dir is not None:
    load_model_tokenizer(tokenizer_dir)  # a bad directory fails before the corpus builds
  options = corpus.BuildOptions(
      sources=tuple(_resolved(s) for s in sources), heldout_fraction=heldout_fraction,
      heldout_repositories=tuple(heldout_repositories), max_file_bytes=max_file_bytes,
      max_total_bytes=max_total_bytes)
  options.validate()
  key_text = json.dumps([options.to_json(), sys.prefix, sys.version], sort_keys=True)
  key = hashlib.sha256(key_text.encode()).hexdigest()[:12]
  cache = pathlib.Path(cache_dir).expanduser()
  cache.mkdir(parents=True, exist_ok=True)
  corpus_dir = cache / f"corpus-{key}"
  with open(cache / f"corpus-{key}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (corpus_dir / corpus.SUMMARY).exists():
      corpus.build(corpus_dir, options, progress=progress)
    built = reader.Corpus(corpus_dir)
    for split in corpus.SPLITS:
      if not built.summary["splits"][split]["documents"]:
        raise ValueError(f"the corpus in {corpus_dir} has no {split} documents; raise "
                         "max_total_bytes, add sources, or change heldout_fraction / "
                         "heldout_repositories.")
    if tokenizer_file is not None or tokenizer_dir is not None:
      return Prepared(corpus_dir, pathlib.Path(tokenizer_file or tokenizer_dir).expanduser())
    tokenizer_path = corpus_dir / f"tokenizer-bpe{vocab_size}-{tokenizer_train_bytes}.json"
    if not tokenizer_path.exists():
      tokenizer = train_bpe(built.texts("train", tokenizer_train_bytes), vocab_size)
      tokenizer.save(tokenizer_path)
  return Prepared(corpus_dir, tokenizer_path)


def default_config() -> ml_collections.ConfigDict:
  """The data section of a training config: prepare()'s arguments plus the cache dir."""
  c = ml_collections.ConfigDict()
  c.cache_dir = "~/.cache/c2jax/data"
  c.vocab_size = 4096
  c.sources = list(DEFAULT_SOURCES)
  c.max_file_bytes = 256 * 1024
  c.max_total_bytes = 64 * 2**20
  c.heldout_fraction = 0.05
  c.heldout_repositories = []
  c.tokenizer_train_bytes = 8 * 2**20
  c.tokenizer_file = ml_collections.FieldReference(None, field_type=str)
  # A released model's directory: its tokenizer (tokenizer.json or tiktoken.model) and chat
  # template render SFT data and agent prompts (set agent.tool_format to its format).
  c.tokenizer_dir = ml_collections.FieldReference(None, field_type=str)
  return c


def prepare_from_config(cfg: ml_collections.ConfigDict, *, progress: bool = True) -> Prepared:
  return prepare(cfg.cache_dir, vocab_size=cfg.vocab_size, sources=tuple(cfg.sources),
                 max_file_bytes=cfg.max_file_bytes, max_total_bytes=cfg.max_total_bytes,
                 heldout_fraction=cfg.heldout_fraction,
                 heldout_repositories=tuple(cfg.heldout_repositories),
                 tokenizer_train_bytes=cfg.tokenizer_train_bytes,
                 tokenizer_file=cfg.tokenizer_file, tokenizer_dir=cfg.tokenizer_dir,
                 progress=progress)
