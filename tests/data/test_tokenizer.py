"""Byte-level BPE training, special tokens, save/load and foreign tokenizer.json files."""

import pickle

import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers, trainers

from c2jax.data import tokenizer
from c2jax.data.tokenizer import SPECIAL_TOKENS


def test_special_tokens_take_the_first_ids(tok):
  assert [tok.token_id(t) for t in SPECIAL_TOKENS.all()] == list(range(len(SPECIAL_TOKENS.all())))
  assert tok.pad_id == 0 and tok.vocab_size == 320
  assert "<tool_call>" in SPECIAL_TOKENS.all()


@pytest.mark.parametrize("text", ["def add(a, b):\n    return a + b\n", "ünï ✓ 日本\t\r\n",
                                  "", "  leading spaces"])
def test_encode_decode_round_trip(tok, text):
  ids = tok.encode(text)
  assert ids.dtype == np.int32
  assert tok.decode(ids) == text


def test_merges_were_learned(tok):
  text = "def add(a, b):\n  return a + b\n"
  assert len(tok.encode(text)) < len(text.encode())


def test_marker_strings_in_text_are_plain_characters(tok):
  ids = tok.encode("<|user|> hi <tool_call>")
  specials = {tok.token_id(t) for t in SPECIAL_TOKENS.all()}
  assert not specials & set(ids.tolist())
  assert tok.decode(ids) == "<|user|> hi <tool_call>"


def test_save_load_round_trip(tok, tmp_path):
  tok.save(tmp_path / "t.json")
  loaded = tokenizer.Tokenizer.load(tmp_path / "t.json")
  text = "class C(A):\n  def f(self): <|end|>\n"
  np.testing.assert_array_equal(loaded.encode(text), tok.encode(text))
  assert loaded.ids == tok.ids and loaded.added_tokens == ()


def test_pickled_tokenizer_still_reads_markers_as_text(tok):
  # grain sends the tokenizer to worker processes by pickling it.
  clone = pickle.loads(pickle.dumps(tok))
  np.testing.assert_array_equal(clone.encode("<|end|> x"), tok.encode("<|end|> x"))
  assert clone.ids == tok.ids


def test_foreign_tokenizer_gets_missing_specials_appended(tmp_path):
  hf = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
  hf.pre_tokenizer = pre_tokenizers.Whitespace()
  hf.train_from_iterator(["hello world foo bar"] * 5, trainers.BpeTrainer(
      vocab_size=60, special_tokens=["[UNK]", "<|bos|>"], show_progress=False))
  hf.save(str(tmp_path / "tokenizer.json"))
  base = hf.get_vocab_size()
  loaded = tokenizer.Tokenizer.load(tmp_path / "tokenizer.json")
  assert loaded.bos_id == hf.token_to_id("<|bos|>")  # its own token is kept
  assert "<|bos|>" not in loaded.added_tokens
  assert set(loaded.added_tokens) == set(SPECIAL_TOKENS.all()) - {"<|bos|>"}
  assert all(loaded.token_id(t) >= base for t in loaded.added_tokens)
  np.testing.assert_array_equal(loaded.encode("hello world"),
                                hf.encode("hello world").ids)


def test_errors_name_the_fix(tmp_path):
  with pytest.raises(ValueError, match="use at least 268"):
    tokenizer.train_bpe(["x"], 100)
  with pytest.raises(FileNotFoundError, match="no tokenizer file"):
    tokenizer.Tokenizer.load(tmp_path / "missing.json")


def test_token_bytes_rebuild_text_split_inside_characters():
  from c2jax.data import tokenizer as tokenizer_lib
  tok = tokenizer_lib.train_bpe(["héllo wörld ☃ snow"] * 20, 300)
  for text in ["héllo ☃ wörld", "a☃b\n\tc", "<|end|> plain"]:
    pieces = [tok.token_bytes(i) for i in tok.encode(text)]
    assert b"".join(pieces) == text.encode()
  assert any(len(p) and p.decode("utf-8", "replace") != p.decode("utf-8", "ignore")
             for p in (tok.token_bytes(i) for i in tok.encode("☃")))  # a partial char
  assert tok.token_bytes(tok.token_id("<|end|>")) == b"<|end|>"
  with pytest.raises(ValueError, match="outside the vocabulary"):
    tok.token_bytes(10**6)
