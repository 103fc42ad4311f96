"""prepare(): corpus + tokenizer built on first use from a real directory, then cached."""

import pathlib
import sysconfig

import pytest

from c2jax.data import cache, pipeline

STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])
SOURCES = (str(STDLIB / "json"), str(STDLIB / "http"), str(STDLIB / "xml") + "/*")
KWARGS = dict(vocab_size=300, sources=SOURCES, max_total_bytes=400_000,
              heldout_repositories=("json",), heldout_fraction=0.0,
              tokenizer_train_bytes=100_000, progress=False)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  return cache.prepare(tmp_path_factory.mktemp("cache"), **KWARGS)


def test_prepare_builds_a_usable_corpus_and_tokenizer(prepared):
  built = prepared.corpus()
  summary = built.summary
  assert summary["heldout_repositories"] == ["json"]
  assert set(r.name for r in built.repositories("train")) <= {"http", "dom", "etree",
                                                              "parsers", "sax"}
  assert summary["splits"]["train"]["languages"]["python"] > 5
  tok = prepared.tokenizer()
  assert tok.vocab_size == 300
  source = (STDLIB / "json" / "decoder.py").read_text()
  assert tok.decode(tok.encode(source)) == source
  batch = next(iter(pipeline.pretrain_dataset(built, "heldout", tok, seq_len=32,
                                              batch_size=2, shuffle=False, num_epochs=1)))
  assert batch["inputs"].shape == (2, 32) and batch["inputs"].max() < tok.vocab_size


def test_second_call_reuses_the_cache(prepared, tmp_path):
  cache_dir = prepared.corpus_dir.parent
  stamps = {p: p.stat().st_mtime_ns for p in prepared.corpus_dir.iterdir()}
  again = cache.prepare(cache_dir, **KWARGS)
  assert again == prepared
  assert {p: p.stat().st_mtime_ns for p in again.corpus_dir.iterdir()} == stamps
  # A new vocabulary size reuses the corpus and adds a tokenizer beside it.
  other = cache.prepare(cache_dir, **{**KWARGS, "vocab_size": 320})
  assert other.corpus_dir == prepared.corpus_dir
  assert other.tokenizer_path != prepared.tokenizer_path
  assert other.tokenizer().vocab_size == 320


def test_prepare_from_config_matches_keyword_call(prepared):
  cfg = cache.default_config()
  cfg.cache_dir = str(prepared.corpus_dir.parent)
  cfg.sources = list(SOURCES)
  cfg.vocab_size = 300
  cfg.max_total_bytes = 400_000
  cfg.heldout_repositories = ["json"]
  cfg.heldout_fraction = 0.0
  cfg.tokenizer_train_bytes = 100_000
  assert cache.prepare_from_config(cfg, progress=False) == prepared


def test_no_heldout_repository_is_an_error(tmp_path):
  with pytest.raises(ValueError, match="no heldout documents"):
    cache.prepare(tmp_path, **{**KWARGS, "heldout_repositories": ()})
