"""Data: corpus building, tokenizer, chat template, packing and grain pipelines.

  prepare(cache_dir, vocab_size=...)      corpus + tokenizer built once, then cached
  Corpus(dir)                            a built corpus: file / repository documents
  Tokenizer.load(path), train_bpe(...)   byte-level BPE or any HF tokenizer.json
  chat.render / chat.parse               conversations <-> ids + assistant loss mask
  load_model_tokenizer(dir)              a released model's tokenizer.json / tiktoken.model
  chat_template.apply(tok, messages)     its own chat template, transformers' masks
  pretrain_dataset / chat_dataset        grain pipelines of [B, L] train-step batches
"""

from c2jax.data import chat, chat_template
from c2jax.data.corpus import BuildOptions, build
from c2jax.data.cache import Prepared, default_config, prepare, prepare_from_config
from c2jax.data.reader import Corpus
from c2jax.data.records import repository_text
from c2jax.data.model_tokenizer import ModelTokenizer, load_model_tokenizer
from c2jax.data.tokenizer import SPECIAL_TOKENS, Tokenizer, train_bpe

__all__ = [
    "BuildOptions", "Corpus", "ModelTokenizer", "Prepared", "SPECIAL_TOKENS", "Tokenizer",
    "build", "chat", "chat_dataset", "chat_template", "default_config", "load_model_tokenizer",
    "prepare", "prepare_from_config", "pretrain_dataset", "repository_text", "train_bpe",
]

_PIPELINES = ("chat_dataset", "pretrain_dataset")


def __getattr__(name):
  # The grain pipelines are imported on first use: grain (with orbax) takes most of a
  # second to import, and tokenizing, templates and the corpus (what actors, servers and
  # evals use) need none of it.
  if name in _PIPELINES:
    from c2jax.data import pipeline  # pylint: disable=g-import-not-at-top
    return getattr(pipeline, name)
  raise AttributeError(f"module 'c2jax.data' has no attribute {name!r}")
