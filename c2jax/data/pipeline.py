"""grain pipelines producing train-step batches: dicts of [B, L] numpy arrays.

  source (corpus split or chat conversations, random access)
    -> shuffle(seed), reshuffled every epoch -> repeat(num_epochs; None = forever)
    -> this process's shard: every shard_count-th element from shard_index
    -> tokenize (read_threads threads ahead) -> pack to length L (packing.py)
    -> batch B (a short last batch is padded with rows of segment id 0 and loss mask 0,
       so shapes never change) -> optionally worker_count processes (grain mp_prefetch)

`iter(dataset)` is a grain DatasetIterator: `get_state()` is a small JSON-serialisable
dict and `set_state(state)` on a fresh iterator of the same dataset continues with exactly
the batches that followed the saved point, so a resumed run neither skips nor repeats an
example. Training reads a run's data as streams, each one of these pipelines with
shard_index=stream, shard_count=streams (c2jax.data.streams); held-out data is sharded by
process (shard_index=jax.process_index(), shard_count=jax.process_count()).
"""

from __future__ import annotations

import functools
import os

import grain
import numpy as np
from absl import logging
from grain import experimental as grain_experimental

from c2jax.toolcalls import formats
from c2jax.data import chat, chat_template, packing, reader, template_turns
from c2jax.data.model_tokenizer import ModelTokenizer
from c2jax.data.tokenizer import Tokenizer

# Document granularity for corpus pipelines: one file, or one whole repository (its
# files in path order; long-context training).
GRANULARITIES = {
    "file": reader.Corpus.file_documents,
    "repository": reader.Corpus.repository_documents,
}


class _EncodeDocument:
  """Corpus document -> next-token example over <|bos|> text <|eos|>, all trained."""

  def __init__(self, tokenizer: Tokenizer | ModelTokenizer):
    self.tokenizer = tokenizer

  def __call__(self, document: dict[str, str]) -> dict[str, np.ndarray]:
    ids = self.tokenizer.encode_document(document["text"])
    return packing.example(ids, np.ones_like(ids))


class _EncodeConversation:
  """Canonical conversation -> next-token example trained on assistant tokens only."""

  def __init__(self, tokenizer: Tokenizer):
    self.tokenizer = tokenizer

  def __call__(self, messages: list[dict]) -> dict[str, np.ndarray]:
    rendered = chat.render(self.tokenizer, messages)
    return packing.example(rendered.ids, rendered.loss_mask)


class _EncodeTemplateConversation:
  """{messages, tools} -> example rendered by a released model's own chat template,
  trained where the template marks {% generation %} (transformers' assistant mask)."""

  def __init__(self, tokenizer: ModelTokenizer, tool_format: str | None):
    self.tokenizer = tokenizer
    self.format = formats.get_format(tool_format) if tool_format else None
    self.by_turns = not chat_template.has_generation_blocks(tokenizer)

  def __call__(self, conversation: dict) -> dict[str, np.ndarray]:
    messages = conversation["messages"]
    if self.format is not None:
      messages = formats.with_call_ids(messages, self.format)
    tools = conversation.get("tools")
    if self.by_turns:  # no {% generation %}: train on each assistant turn (template_turns)
      rendered = chat_template.tokenize(
          self.tokenizer, *template_turns.turn_spans(self.tokenizer, messages, tools))
    else:
      rendered = chat_template.apply(self.tokenizer, messages, tools=tools)
    return packing.example(rendered.ids, rendered.loss_mask)


def _ordered(ds: grain.MapDataset, *, seed: int, shuffle: bool, num_epochs: int | None,
             shard_index: int, shard_count: int) -> grain.MapDataset:
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index {shard_index} must be in [0, shard_count={shard_count}).")
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f"num_epochs is {num_epochs}; use >= 1, or None to repeat forever.")
  if shuffle:
    ds = ds.shuffle(seed)  # grain reseeds the permutation for every epoch
  if num_epochs != 1:
    ds = ds.repeat(num_epochs)
  return ds[shard_index::shard_count]


def _read(ds: grain.MapDataset, read_threads: int) -> grain.IterDataset:
  # grain's default (16 threads, 500 elements ahead) swamps a small machine and makes
  # every restore refill the buffer; tokenizing a few documents ahead is enough here.
  if read_threads < 0:
    raise ValueError(f"read_threads is {read_threads}; use >= 0 (0: no read-ahead).")
  return ds.to_iter_dataset(grain.ReadOptions(
      num_threads=read_threads, prefetch_buffer_size=8 * read_threads if read_threads else 1))


def _batched(ds: grain.IterDataset, batch_size: int, worker_count: int) -> grain.IterDataset:
  if batch_size <= 0:
    raise ValueError(f"batch_size is {batch_size}; it must be > 0.")
  ds = ds.batch(batch_size, drop_remainder=False, batch_fn=functools.partial(
      grain_experimental.batch_and_pad, batch_size=batch_size))
  if worker_count < 0:
    raise ValueError(f"worker_count is {worker_count}; use >= 0 (0: in this process).")
  if worker_count:
    # Each worker packs its own slice of the documents, so a saved state resumes only
    # with the same worker_count.
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
  return ds


def pretrain_dataset(corpus: reader.Corpus | str | os.PathLike, split: str,
                     tokenizer: Tokenizer, *, seq_len: int, batch_size: int, seed: int = 0,
                     shuffle: bool = True, num_epochs: int | None = None,
                     shard_index: int = 0, shard_count: int = 1, granularity: str = "file",
                     packer: str = "concat_then_split",
                     read_threads: int = 2, worker_count: int = 0) -> grain.IterDataset:
  """Batches of packed corpus documents; eval: shuffle=False, num_epochs=1."""
  if not isinstance(corpus, reader.Corpus):
    corpus = reader.Corpus(corpus)
  if granularity not in GRANULARITIES:
    raise ValueError(f"unknown granularity {granularity!r}; expected one of "
                     f"{sorted(GRANULARITIES)}.")
  documents = GRANULARITIES[granularity](corpus, split)
  ds = _ordered(documents, seed=seed, shuffle=shuffle, num_epochs=num_epochs,
                shard_index=shard_index, shard_count=shard_count)
  ds = _read(ds.map(_EncodeDocument(tokenizer)), read_threads)
  return _batched(packing.pack(ds, packer, seq_len, seed), batch_size, worker_count)


def chat_dataset(conversations: list[list[dict]] | str | os.PathLike,
                 tokenizer: Tokenizer | ModelTokenizer,
                 *, seq_len: int, batch_size: int, seed: int = 0, shuffle: bool = True,
                 num_epochs: int | None = None, shard_index: int = 0, shard_count: int = 1,
                 packer: str = "first_fit", read_threads: int = 2,
                 worker_count: int = 0, tool_format: str | None = None) -> grain.IterDataset:
  """Batches of packed conversations (a JSONL path or message lists), loss on assistant.

  With a released model's tokenizer (ModelTokenizer) conversations are rendered by its own
  chat template, with each JSONL line's `tools` if given, and trained on its
  {% generation %} spans (transformers' assistant mask); a template without them (most
  released ones) trains on each assistant turn from the generation prompt to the closing
  token (template_turns.py), what the model emits when prompted. `tool_format` (the
  agent's) rewrites tool-call ids to that format's convention, so SFT teaches the ids the
  agent parses.
  """
  templated = isinstance(tokenizer, ModelTokenizer)
  if templated:
    if not chat_template.has_generation_blocks(tokenizer):
      logging.info("the chat template of %s has no {%% generation %%} blocks: training on "
                   "assistant turns from the generation prompt to %r.", tokenizer.directory,
                   template_turns.closing_token(tokenizer))
    if isinstance(conversations, list):
      conversations = [{"messages": m} for m in conversations]
    else:
      conversations = chat_template.load_jsonl(os.fspath(conversations))
  else:
    if tool_format not in (None, "c2jax"):
      raise ValueError(f"tool_format {tool_format!r} needs a released model's tokenizer and "
                       "chat template (data.tokenizer_dir); c2jax's own template writes the "
                       "c2jax protocol.")
    if not isinstance(conversations, list):
      conversations = chat.load_jsonl(os.fspath(conversations))
  if not conversations:
    raise ValueError("no conversations to train on; the chat data is empty.")
  ds = _ordered(grain.MapDataset.source(conversations), seed=seed, shuffle=shuffle,
                num_epochs=num_epochs, shard_index=shard_index, shard_count=shard_count)
  encode = (_EncodeTemplateConversation(tokenizer, tool_format) if templated
            else _EncodeConversation(tokenizer))
  ds = _read(ds.map(encode), read_threads)
  return _batched(packing.pack(ds, packer, seq_len, seed), batch_size, worker_count)
