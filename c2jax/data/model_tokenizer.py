"""A released model's own tokenizer: `tokenizer.json` (HF `tokenizers`) or `tiktoken.model`.

    tok = load_model_tokenizer("path/to/model_dir")
    tok.encode("plain text")                     # special-token strings stay plain text
    ids, offsets = tok.encode_chat(rendered)     # special-token strings become their ids

A model directory holds either a `tokenizer.json` or, for Kimi-K2/K2.5, a `tiktoken.model`
(base64 token, rank per line) whose special tokens (ids after the ranks) and their names are
in `tokenizer_config.json` `added_tokens_decoder`, and whose split pattern is Kimi's unless
`tokenizer_config.json` names one under `pat_str`. The named special tokens (`bos_token`,
`eos_token`, ...) and the chat template (`chat_template.jinja`, else `chat_template` in
`tokenizer_config.json`) come from the same directory, as transformers reads them.

Two encodings on purpose: `encode` (documents, tool output, anything untrusted) never turns a
marker string into a control token; `encode_chat` is what transformers' apply_chat_template
does to a rendered template (added tokens in the text are matched), and returns per-token
character offsets so assistant masks can be computed from the template's generation spans.
"""

from __future__ import annotations

import json
import os

import numpy as np
import tokenizers

# Kimi-K2's pre-tokenisation pattern (tokenization_kimi.py): Han runs apart, cased words with
# English contractions, up to 3 digits, punctuation runs, newlines, whitespace.
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                  "cls_token", "mask_token")
TOKENIZER_FILES = ("tokenizer.json", "tiktoken.model")


def _token_text(value) -> str | None:
  """tokenizer_config.json writes a token as a string or as a serialised AddedToken."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else None


class _HFBackend:
  """tokenizer.json through HF `tokenizers`; two copies differ only in whether added
  tokens (special or not, e.g. Qwen's <tool_call>) written in the text are matched."""

  def __init__(self, path: str):
    self.path = path
    self._chat = tokenizers.Tokenizer.from_file(path)
    with open(path, encoding="utf-8") as f:
      spec = json.load(f)
    spec["added_tokens"] = []  # nothing but the base model's merges
    self._plain = tokenizers.Tokenizer.from_str(json.dumps(spec))
    self.control_tokens = tuple(
        t.content for t in self._chat.get_added_tokens_decoder().values())

  def __reduce__(self):
    return _HFBackend, (self.path,)

  @property
  def vocab_size(self) -> int:
    return self._chat.get_vocab_size(with_added_tokens=True)

  def token_to_id(self, token: str) -> int | None:
    return self._chat.token_to_id(token)

  def encode(self, text: str) -> list[int]:
    return self._plain.encode(text, add_special_tokens=False).ids

  def encode_chat(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    encoding = self._chat.encode(text, add_special_tokens=False)
    return encoding.ids, encoding.offsets

  def decode(self, ids: list[int]) -> str:
    return self._chat.decode(ids, skip_special_tokens=False)


class _TiktokenBackend:
  """tiktoken.model with special tokens from tokenizer_config.json (Kimi-K2's layout)."""

  def __init__(self, path: str, specials: dict[int, str], pattern: str):
    import tiktoken  # pylint: disable=import-outside-toplevel
    from tiktoken import load as tiktoken_load  # pylint: disable=import-outside-toplevel

    self.path, self.specials, self.pattern = path, dict(specials), pattern
    ranks = tiktoken_load.load_tiktoken_bpe(path)
    clash = sorted(i for i in specials if i < len(ranks))
    if clash:
      raise ValueError(f"{path}: tokenizer_config.json declares special token ids {clash[:5]} "
                       f"inside the BPE ranks (0..{len(ranks) - 1}); special tokens must come "
                       "after the ranks, as in Kimi-K2's tokenizer.")
    named = {text: i for i, text in specials.items()}
    top = max(specials, default=len(ranks) - 1)
    for i in range(len(ranks), top + 1):  # ids without a name, as Kimi reserves them
      if i not in specials:
        named[f"<|reserved_token_{i}|>"] = i
    self._encoding = tiktoken.Encoding(name=os.path.basename(path), pat_str=pattern,
                                       mergeable_ranks=ranks, special_tokens=named)
    self.control_tokens = tuple(named)
    self._vocab_size = top + 1

  def __reduce__(self):
    return _TiktokenBackend, (self.path, self.specials, self.pattern)

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  def token_to_id(self, token: str) -> int | None:
    if token in self._encoding._special_tokens:  # pylint: disable=protected-access
      return self._encoding._special_tokens[token]  # pylint: disable=protected-access
    try:
      return self._encoding.encode_single_token(token.encode("utf-8"))
    except KeyError:
      return None

  def encode(self, text: str) -> list[int]:
    return self._encoding.encode(text, allowed_special=set(), disallowed_special=())

  def encode_chat(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    ids = self._encoding.encode(text, allowed_special="all", disallowed_special=())
    # Character offsets from token byte lengths: a token that splits a multi-byte
    # character covers that whole character, as HF byte-level offsets do.
    char_of_byte = np.repeat(np.arange(len(text)),
                             [len(c.encode("utf-8")) for c in text]).tolist()
    offsets, byte = [], 0
    for piece in self._encoding.decode_tokens_bytes(ids):
      end = byte + len(piece)
      offsets.append((char_of_byte[byte], char_of_byte[end - 1] + 1) if piece else
                     (len(text), len(text)))
      byte = end
    return ids, offsets

  def decode(self, ids: list[int]) -> str:
    return self._encoding.decode(ids, errors="replace")


class ModelTokenizer:
  """A model's tokenizer with its named special tokens and chat template.

  Shares the surface of c2jax's own `Tokenizer` that data pipelines use (encode, decode,
  token_id, vocab_size, bos_id, eos_id, pad_id), plus `encode_chat` for templates.
  """

  def __init__(self, backend, special_tokens: dict[str, str], chat_template,
               directory: str):
    self._backend = backend
    self.special_tokens = dict(special_tokens)  # bos_token -> "<|...|>", as transformers
    self.chat_template = chat_template  # str, {name: str}, or None
    self.directory = directory
    for name, token in self.special_tokens.items():
      if backend.token_to_id(token) is None:
        raise ValueError(f"{directory}: {name} is {token!r}, which is not a token of the "
                         "tokenizer; fix tokenizer_config.json.")

  @property
  def vocab_size(self) -> int:
    return self._backend.vocab_size

  @property
  def control_tokens(self) -> tuple[str, ...]:
    """The added tokens `encode_chat` matches in text and `encode` never does."""
    return self._backend.control_tokens

  def _named_id(self, name: str) -> int:
    token = self.special_tokens.get(name)
    if token is None:
      raise ValueError(f"the tokenizer in {self.directory} has no {name}; set it in "
                       "tokenizer_config.json.")
    return self._backend.token_to_id(token)

  @property
  def bos_id(self) -> int:
    return self._named_id("bos_token")

  @property
  def eos_id(self) -> int:
    return self._named_id("eos_token")

  @property
  def pad_id(self) -> int:
    """The pad token, else eos (many released models have no pad token)."""
    return self._named_id("pad_token" if "pad_token" in self.special_tokens else "eos_token")

  def token_id(self, token: str) -> int:
    token_id = self._backend.token_to_id(token)
    if token_id is None:
      raise KeyError(f"{token!r} is not a single token of the tokenizer in {self.directory}.")
    return token_id

  def encode(self, text: str) -> np.ndarray:
    """Ids of `text` read as plain characters (added-token strings included)."""
    return np.asarray(self._backend.encode(text), np.int32)

  def encode_chat(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Ids of rendered template text, special-token strings matched as tokens (what
    apply_chat_template does), and int32 [T, 2] character offsets of each token."""
    ids, offsets = self._backend.encode_chat(text)
    return (np.asarray(ids, np.int32),
            np.asarray(offsets, np.int32).reshape(len(ids), 2))

  def decode(self, ids) -> str:
    return self._backend.decode([int(i) for i in ids])

  def encode_document(self, text: str) -> np.ndarray:
    """A pretraining document: bos (when the model has one, Qwen does not), text, eos."""
    bos = [self.bos_id] if "bos_token" in self.special_tokens else []
    return np.concatenate([bos, self.encode(text), [self.eos_id]]).astype(np.int32)

  def template(self, name: str | None = None, *, tools: bool = False) -> str:
    """The chat template to render: `name` from several, else 'tool_use' when tools are
    given and the model has one, else 'default' (transformers' choice)."""
    template = self.chat_template
    if template is None:
      raise ValueError(f"{self.directory} has no chat template: add chat_template.jinja or "
                       "`chat_template` to tokenizer_config.json.")
    if isinstance(template, str):
      if name not in (None, "default"):
        raise ValueError(f"{self.directory} has one chat template; there is no {name!r}.")
      return template
    if name is None:
      name = "tool_use" if tools and "tool_use" in template else "default"
    if name not in template:
      raise ValueError(f"{self.directory} has chat templates {sorted(template)}; "
                       f"{name!r} is not one of them.")
    return template[name]


def _read_config(directory: str) -> dict:
  path = os.path.join(directory, "tokenizer_config.json")
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8") as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} is not valid JSON ({e.msg}).") from e


def _chat_template(directory: str, config: dict):
  """chat_template.jinja (plus named ones in additional_chat_templates/NAME.jinja), as
  transformers saves them; else tokenizer_config.json's string or [{name, template}]."""
  jinja_path = os.path.join(directory, "chat_template.jinja")
  extra_dir = os.path.join(directory, "additional_chat_templates")
  extra = {}
  if os.path.isdir(extra_dir):
    for name in sorted(os.listdir(extra_dir)):
      if name.endswith(".jinja"):
        with open(os.path.join(extra_dir, name), encoding="utf-8") as f:
          extra[name.removesuffix(".jinja")] = f.read()
  if os.path.isfile(jinja_path):
    with open(jinja_path, encoding="utf-8") as f:
      template = f.read()
  else:
    template = config.get("chat_template")
  if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
    template = {item["name"]: item["template"] for item in template}
  if extra:
    template = {**extra, **({"default": template} if isinstance(template, str)
                            else template or {})}
  return template


def load_model_tokenizer(directory: str | os.PathLike) -> ModelTokenizer:
  """The tokenizer of a model directory (tokenizer.json or tiktoken.model)."""
  directory = os.fspath(directory)
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"no model directory at {directory}; pass a directory holding "
                            f"one of {TOKENIZER_FILES} and tokenizer_config.json.")
  config = _read_config(directory)
  json_path = os.path.join(directory, "tokenizer.json")
  tiktoken_path = os.path.join(directory, "tiktoken.model")
  if os.path.isfile(json_path):
    backend = _HFBackend(json_path)
  elif os.path.isfile(tiktoken_path):
    specials = {}
    for token_id, entry in (config.get("added_tokens_decoder") or {}).items():
      text = _token_text(entry)
      if text is None:
        raise ValueError(f"{directory}/tokenizer_config.json: added_tokens_decoder[{token_id}] "
                         "has no content string.")
      specials[int(token_id)] = text
    backend = _TiktokenBackend(tiktoken_path, specials, config.get("pat_str", KIMI_PATTERN))
  else:
    raise FileNotFoundError(f"{directory} holds none of {TOKENIZER_FILES}; copy the model's "
                            "tokenizer files there.")
  named = {name: _token_text(config.get(name)) for name in NAMED_SPECIALS}
  named = {name: token for name, token in named.items() if token is not None}
  return ModelTokenizer(backend, named, _chat_template(directory, config), directory)
