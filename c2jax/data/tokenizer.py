"""Tokenizer: a byte-level BPE trained with HF `tokenizers`, or any HF `tokenizer.json`.

The special tokens are the ones the chat template (chat.py) and the agent's tool-call
protocol (c2jax/agent/protocol.py) need: bos/eos/pad, one marker per role, an end-of-message
marker, and the tool-call / tool-result markers. A trained tokenizer gives them the first
ids (pad = 0, so zero-filled padding is pad); a loaded tokenizer that lacks some gets them
appended after its own vocabulary, and `added_tokens` says which, because a model whose
embedding table is sized for the original vocabulary cannot use them.

`encode` treats every string as plain characters, so a marker string inside user content,
tool output or a source file can never inject a role switch; the chat template places
marker tokens explicitly by id (`token_id`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

import numpy as np
import tokenizers
from absl import logging
from tokenizers import decoders, models, pre_tokenizers, trainers

from c2jax.toolcalls import protocol


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
  pad: str = "<|pad|>"
  bos: str = "<|bos|>"
  eos: str = "<|eos|>"
  end: str = "<|end|>"  # closes every chat message
  system: str = "<|system|>"
  user: str = "<|user|>"
  assistant: str = "<|assistant|>"
  tool: str = "<|tool|>"
  protocol: tuple[str, ...] = (protocol.TOOL_CALL_START, protocol.TOOL_CALL_END,
                               protocol.TOOL_RESULT_START, protocol.TOOL_RESULT_END)

  def all(self) -> list[str]:
    return [self.pad, self.bos, self.eos, self.end, self.system, self.user,
            self.assistant, self.tool, *self.protocol]

  def role(self, role: str) -> str:
    return {"system": self.system, "user": self.user, "assistant": self.assistant,
            "tool": self.tool}[role]


SPECIAL_TOKENS = SpecialTokens()


def _byte_level_alphabet() -> dict[str, int]:
  """The byte-level BPE's character for each byte (GPT-2's table): printable Latin-1
  bytes stand for themselves, the other bytes for code points 256, 257, ... in order."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
               *range(ord("\u00ae"), ord("\u00ff") + 1)]
  table, extra = {}, 0
  for byte in range(256):
    if byte in printable:
      table[chr(byte)] = byte
    else:
      table[chr(256 + extra)] = byte
      extra += 1
  return table


_UNICODE_TO_BYTE = _byte_level_alphabet()


class Tokenizer:
  """Token ids in and out as int32 numpy arrays."""

  def __init__(self, hf: tokenizers.Tokenizer, specials: SpecialTokens = SPECIAL_TOKENS,
               added_tokens: tuple[str, ...] = ()):
    self.specials = specials
    self.added_tokens = added_tokens
    self._hf = hf
    # Special-token strings in text are encoded as ordinary characters (not saved to JSON).
    self._hf.encode_special_tokens = True
    self._added = {t.content for t in hf.get_added_tokens_decoder().values()}
    self.ids = {}
    for token in specials.all():
      token_id = hf.token_to_id(token)
      if token_id is None:
        raise ValueError(f"tokenizer has no id for special token {token!r}; load it with "
                         "Tokenizer.load(), which adds missing special tokens.")
      self.ids[token] = token_id

  def __reduce__(self):
    # The encode_special_tokens flag is not part of the JSON, so rebuild through __init__
    # (grain worker processes receive the tokenizer pickled).
    return _from_json, (self._hf.to_str(), self.specials, self.added_tokens)

  @property
  def vocab_size(self) -> int:
    return self._hf.get_vocab_size(with_added_tokens=True)

  @property
  def pad_id(self) -> int:
    return self.ids[self.specials.pad]

  @property
  def bos_id(self) -> int:
    return self.ids[self.specials.bos]

  @property
  def eos_id(self) -> int:
    return self.ids[self.specials.eos]

  def token_id(self, token: str) -> int:
    return self.ids[token]

  def encode(self, text: str) -> np.ndarray:
    """Ids of `text`, read as plain characters (marker strings included)."""
    # add_special_tokens=False: a loaded tokenizer's post-processor must not add its own
    # BOS/EOS; documents and chats place theirs explicitly.
    return np.asarray(self._hf.encode(text, add_special_tokens=False).ids, np.int32)

  def decode(self, ids) -> str:
    return self._hf.decode([int(i) for i in ids], skip_special_tokens=False)

  def encode_document(self, text: str) -> np.ndarray:
    """A pretraining document: <|bos|> text <|eos|>."""
    return np.concatenate([[self.bos_id], self.encode(text), [self.eos_id]]).astype(np.int32)

  def token_bytes(self, token_id: int) -> bytes:
    """The raw bytes one token stands for. A byte-level BPE token may hold part of a
    UTF-8 character, which `decode([token_id])` can only show as U+FFFD; an OpenAI
    client rebuilds text from these bytes (logprobs' `bytes` field)."""
    piece = self._hf.id_to_token(int(token_id))
    if piece is None:
      raise ValueError(f"token id {token_id} is outside the vocabulary "
                       f"[0, {self.vocab_size}).")
    if piece in self._added or not isinstance(self._hf.decoder, decoders.ByteLevel):
      return self.decode([token_id]).encode("utf-8")
    return bytes(_UNICODE_TO_BYTE[c] for c in piece)

  def save(self, path: str | os.PathLike) -> None:
    tmp = f"{path}.tmp"
    self._hf.save(tmp)
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str | os.PathLike,
           specials: SpecialTokens = SPECIAL_TOKENS) -> "Tokenizer":
    """Loads any HF tokenizer.json, adding the special tokens it lacks."""
    if not os.path.isfile(path):
      raise FileNotFoundError(f"no tokenizer file at {path}; train one with "
                              "`c2jax data tokenizer` or pass a HF tokenizer.json.")
    hf = tokenizers.Tokenizer.from_file(str(path))
    missing = tuple(t for t in specials.all() if hf.token_to_id(t) is None)
    if missing:
      hf.add_special_tokens(list(missing))
      logging.warning("tokenizer %s lacked special tokens %s; they were added after its "
                      "vocabulary (ids >= %d), so the model's vocabulary must cover them.",
                      path, list(missing), hf.get_vocab_size(with_added_tokens=False))
    return cls(hf, specials, missing)


def _from_json(text: str, specials: SpecialTokens, added_tokens: tuple[str, ...]) -> Tokenizer:
  return Tokenizer(tokenizers.Tokenizer.from_str(text), specials, added_tokens)


def train_bpe(texts: Iterable[str], vocab_size: int, *,
              specials: SpecialTokens = SPECIAL_TOKENS, min_frequency: int = 2) -> Tokenizer:
  """Trains a byte-level BPE on `texts`; ids 0.. are the special tokens, in order."""
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  floor = len(alphabet) + len(specials.all())
  if vocab_size < floor:
    raise ValueError(f"vocab_size {vocab_size} is too small: a byte-level BPE needs the "
                     f"{len(alphabet)} bytes plus {len(specials.all())} special tokens, so "
                     f"use at least {floor}.")
  hf = tokenizers.Tokenizer(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  hf.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                special_tokens=specials.all(), initial_alphabet=alphabet,
                                show_progress=False)
  hf.train_from_iterator(texts, trainer)
  return Tokenizer(hf, specials)
