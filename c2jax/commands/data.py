"""`c2jax data <sub-verb>`: build the code corpus and tokenizer.

  c2jax data build --out DIR [--sources=stdlib,site-packages,DIR,DIR/*]
                   [--heldout-fraction F] [--heldout-repositories a,b]
                   [--max-file-bytes N] [--max-total-bytes N] [--shard-bytes N]
  c2jax data tokenizer --corpus DIR --out FILE [--vocab-size N] [--train-bytes N]
  c2jax data prepare --cache-dir DIR [--vocab-size N] [--sources ...] [byte budgets]
  c2jax data template --tokenizer-dir MODEL_DIR --messages FILE.jsonl [--line N]
                      [--generation-prompt]

`build` resumes when rerun with the same --out and options, and writes DIR/summary.json;
`prepare` is what `c2jax pretrain` runs on first use (build + tokenizer, cached).
`template` shows how a released model's own chat template renders one conversation of an
SFT JSONL: the text with the trained ({% generation %}) spans between ⟦ and ⟧, and
the token counts, i.e. exactly what SFT with data.tokenizer_dir trains on.
"""

from __future__ import annotations

import json
import pathlib

from absl import flags

from c2jax.data import (cache, chat_template, corpus, model_tokenizer, reader, sources,
                        tokenizer)

_OUT = flags.DEFINE_string("out", None, "build: corpus directory; tokenizer: output file.")
_SOURCES = flags.DEFINE_list(
    "sources", list(sources.DEFAULT_SOURCES),
    "Source specs: stdlib, site-packages, a directory (one repository; git checkouts list "
    "tracked files) or DIR/* (each subdirectory one repository).")
_HELDOUT_FRACTION = flags.DEFINE_float(
    "heldout-fraction", 0.05, "Fraction of repositories held out (by hash of the name).")
_HELDOUT_REPOS = flags.DEFINE_list(
    "heldout-repositories", [], "Repository names always held out.")
_MAX_FILE_BYTES = flags.DEFINE_integer("max-file-bytes", 256 * 1024,
                                       "Files larger than this are dropped.")
_MAX_TOTAL_BYTES = flags.DEFINE_integer(
    "max-total-bytes", 0, "Stop once this many bytes are kept (0: no limit; prepare: 64MiB).")
_SHARD_BYTES = flags.DEFINE_integer("shard-bytes", 64 * 2**20, "Target bytes per shard.")
_CORPUS = flags.DEFINE_string("corpus", None, "tokenizer: a built corpus directory.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab-size", 4096, "BPE vocabulary size.")
_TRAIN_BYTES = flags.DEFINE_integer("train-bytes", 8 * 2**20,
                                    "Bytes of training text used to train the tokenizer.")
_CACHE_DIR = flags.DEFINE_string("cache-dir", None, "prepare: the cache directory.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")
_TOKENIZER_DIR = flags.DEFINE_string("tokenizer-dir", None,
                                     "template: a released model's tokenizer directory.")
_MESSAGES = flags.DEFINE_string("messages", None, "template: an SFT JSONL of conversations.")
_LINE = flags.DEFINE_integer("line", 1, "template: which conversation (1 = the first).")
_GENERATION_PROMPT = flags.DEFINE_bool("generation-prompt", False,
                                       "template: end with the next turn's prompt.")


def _require(holder: flags.FlagHolder, sub_verb: str) -> str:
  if not holder.value:
    raise SystemExit(f"c2jax data {sub_verb}: --{holder.name} is required.")
  return holder.value


def _build() -> int:
  options = corpus.BuildOptions(
      sources=tuple(_SOURCES.value), heldout_fraction=_HELDOUT_FRACTION.value,
      heldout_repositories=tuple(_HELDOUT_REPOS.value),
      max_file_bytes=_MAX_FILE_BYTES.value, max_total_bytes=_MAX_TOTAL_BYTES.value or None,
      shard_bytes=_SHARD_BYTES.value)
  out = pathlib.Path(_require(_OUT, "build"))
  summary = corpus.build(out, options, progress=_PROGRESS.value)
  for split, stats in summary["splits"].items():
    print(f"{split}: {stats['repositories']} repositories, {stats['documents']} documents, "
          f"{stats['bytes'] / 2**20:.2f} MiB")
  dropped = {k: v["files"] for k, v in summary["dropped"].items() if v["files"]}
  print(f"dropped files: {json.dumps(dropped)}; summary in {out / corpus.SUMMARY}")
  return 0


def _tokenizer() -> int:
  built = reader.Corpus(_require(_CORPUS, "tokenizer"))
  out = _require(_OUT, "tokenizer")
  tok = tokenizer.train_bpe(built.texts("train", _TRAIN_BYTES.value), _VOCAB_SIZE.value)
  tok.save(out)
  print(f"tokenizer with {tok.vocab_size} tokens written to {out}")
  return 0


def _prepare() -> int:
  prepared = cache.prepare(
      _require(_CACHE_DIR, "prepare"), vocab_size=_VOCAB_SIZE.value,
      sources=tuple(_SOURCES.value), max_file_bytes=_MAX_FILE_BYTES.value,
      max_total_bytes=_MAX_TOTAL_BYTES.value or 64 * 2**20,
      heldout_fraction=_HELDOUT_FRACTION.value,
      heldout_repositories=tuple(_HELDOUT_REPOS.value),
      tokenizer_train_bytes=_TRAIN_BYTES.value, progress=_PROGRESS.value)
  print(f"corpus: {prepared.corpus_dir}\ntokenizer: {prepared.tokenizer_path}")
  return 0


def _template() -> int:
  tok = model_tokenizer.load_model_tokenizer(_require(_TOKENIZER_DIR, "template"))
  conversations = chat_template.load_jsonl(_require(_MESSAGES, "template"))
  if not 1 <= _LINE.value <= len(conversations):
    raise ValueError(f"--line={_LINE.value} but {_MESSAGES.value} holds "
                     f"{len(conversations)} conversations.")
  conversation = conversations[_LINE.value - 1]
  rendered = chat_template.apply(tok, conversation["messages"], tools=conversation["tools"],
                                 add_generation_prompt=_GENERATION_PROMPT.value)
  shown, pos = [], 0
  for start, end in rendered.spans:
    shown += [rendered.text[pos:start], "\u27e6", rendered.text[start:end], "\u27e7"]
    pos = end
  print("".join(shown) + rendered.text[pos:])
  print(f"--- {len(rendered.ids)} tokens, {int(rendered.loss_mask.sum())} trained, "
        f"{len(rendered.spans)} generation spans")
  return 0


SUB_VERBS = {
    "build": (_build, "build (or resume) a corpus of ArrayRecord shards"),
    "tokenizer": (_tokenizer, "train a byte-level BPE on a built corpus"),
    "prepare": (_prepare, "build and cache corpus + tokenizer (what pretrain runs)"),
    "template": (_template, "show a model's chat template render and trained spans"),
}


def main(argv) -> int:
  if len(argv) != 2 or argv[1] not in SUB_VERBS:
    listing = "\n".join(f"  {name:<10} {doc}" for name, (_, doc) in SUB_VERBS.items())
    got = " ".join(argv[1:]) or "nothing"
    raise SystemExit(f"c2jax data: expected one sub-verb, got {got}.\n{listing}\n"
                     "`c2jax data --help` lists the flags.")
  try:
    return SUB_VERBS[argv[1]][0]()
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f"c2jax data {argv[1]}: {e}") from e
