"""The text of a held-out codebase, as the codebase-perplexity eval reads it (report App. B).

The files of one repository, filtered (code extensions, no binaries, no vendored or
generated directories, a size cap) and concatenated in alphabetical order of their
relative POSIX path, each preceded by a path header. The default header is the corpus's
(`c2jax.data.records.FILE_HEADER`), so the evaluated text has exactly the layout of the
repository-level documents the model was trained on.

Each file's document (header + text, ending in a newline) is tokenised on its own and the
ids are concatenated, so every token belongs to exactly one file and per-file NLL is exact;
a BPE merge never spans two files.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Sequence

import numpy as np

from c2jax.data import records, sources

# Directories whose files are someone else's code or generated output, not the codebase.
VENDORED_DIRS = ("vendor", "vendored", "third_party", "third-party", "thirdparty",
                 "external", "node_modules", "site-packages", "dist", "build",
                 "__pycache__", ".git", ".venv", "venv")
SKIP_REASONS = ("vendored", "extension", "too_large", "binary", "empty", "unreadable")


@dataclasses.dataclass(frozen=True)
class CodebaseOptions:
  """Which files count and how they are joined.

  extensions: file suffixes (".py") or exact names ("Makefile") to keep; empty means every
    type the corpus builder treats as code (`c2jax.data.sources.LANGUAGES`).
  skip_dirs: a file is skipped when any directory in its path has one of these names.
  header: put before each file; `{path}` is replaced by the relative path.
  separator: put between consecutive files (after a file's final newline).
  add_bos: start the stream with the tokenizer's BOS so the first file's first token is
    scored too (it is the context of position 0).
  """
  extensions: tuple[str, ...] = ()
  skip_dirs: tuple[str, ...] = VENDORED_DIRS
  max_file_bytes: int = 1 << 20
  header: str = records.FILE_HEADER
  separator: str = ""
  add_bos: bool = True

  def validate(self) -> None:
    try:
      self.header.format(path="x")
    except (KeyError, IndexError, ValueError) as e:
      raise ValueError(f"CodebaseOptions.header = {self.header!r} is not a format string "
                       "whose only field is {path} (write literal braces as {{ }}).") from e
    if self.max_file_bytes < 1:
      raise ValueError(f"CodebaseOptions.max_file_bytes = {self.max_file_bytes}; use >= 1.")
    bad = [e for e in self.extensions if not e or "/" in e]
    if bad:
      raise ValueError(f"CodebaseOptions.extensions has {bad}; give suffixes such as '.py' "
                       "or exact file names such as 'Makefile'.")


@dataclasses.dataclass(frozen=True)
class SourceFile:
  path: str  # relative POSIX path
  text: str


@dataclasses.dataclass(frozen=True)
class Codebase:
  """The kept files in evaluation order and why the others were left out."""
  root: pathlib.Path
  files: tuple[SourceFile, ...]
  skipped: dict[str, int]  # reason (one of SKIP_REASONS) -> count


@dataclasses.dataclass(frozen=True)
class CodebaseTokens:
  """The token stream: ids [N] and, per file, its span [start, end) in ids and the UTF-8
  size of its document (header, text, separator)."""
  ids: np.ndarray
  paths: tuple[str, ...]
  starts: np.ndarray  # [F] int64
  ends: np.ndarray  # [F] int64
  num_bytes: np.ndarray  # [F] int64

  def file_index(self) -> np.ndarray:
    """[N] int64: the file each token belongs to (-1 for the leading BOS)."""
    index = np.full(len(self.ids), -1, np.int64)
    for i, (start, end) in enumerate(zip(self.starts, self.ends)):
      index[start:end] = i
    return index


def _wanted(path: str, options: CodebaseOptions) -> bool:
  if not options.extensions:
    return sources.language_of(path) is not None
  pure = pathlib.PurePosixPath(path)
  return pure.name in options.extensions or pure.suffix in options.extensions


def collect(root: str | os.PathLike, options: CodebaseOptions = CodebaseOptions()) -> Codebase:
  """The files of the repository at `root` (git-tracked files of a checkout, else every
  file of the tree), filtered by `options`, sorted by relative path."""
  options.validate()
  root = pathlib.Path(root).expanduser()
  if not root.is_dir():
    raise FileNotFoundError(f"codebase {root} is not a directory; pass the root of the "
                            "held-out repository.")
  repo = sources.directory_repository(root)
  skip_dirs = frozenset(options.skip_dirs)
  kept, skipped = [], dict.fromkeys(SKIP_REASONS, 0)
  for path in sorted(repo.files):
    if skip_dirs.intersection(pathlib.PurePosixPath(path).parts[:-1]):
      reason = "vendored"
    elif not _wanted(path, options):
      reason = "extension"
    else:
      reason, text = _read(repo.root / path, options.max_file_bytes)
      if reason is None:
        kept.append(SourceFile(path, text))
        continue
    skipped[reason] += 1
  if not kept:
    raise ValueError(f"codebase {root}: no file passed the filters (skipped {skipped}); "
                     "check CodebaseOptions.extensions / skip_dirs / max_file_bytes.")
  return Codebase(repo.root, tuple(kept), skipped)


def _read(full: pathlib.Path, max_bytes: int) -> tuple[str | None, str]:
  try:
    if full.stat().st_size > max_bytes:
      return "too_large", ""
    data = full.read_bytes()
  except OSError:
    return "unreadable", ""
  if b"\0" in data:
    return "binary", ""
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError:
    return "binary", ""
  if not text.strip():
    return "empty", ""
  return None, text


def documents(files: Sequence[SourceFile], options: CodebaseOptions = CodebaseOptions()
              ) -> list[str]:
  """Each file's text as it appears in the concatenation (header, text, separator)."""
  docs = []
  for i, f in enumerate(files):
    body = f.text if f.text.endswith("\n") else f.text + "\n"
    tail = options.separator if i + 1 < len(files) else ""
    docs.append(options.header.format(path=f.path) + body + tail)
  return docs


def tokenize(codebase: Codebase, tokenizer, options: CodebaseOptions = CodebaseOptions()
             ) -> CodebaseTokens:
  """The codebase as one token stream (see the module docstring)."""
  docs = documents(codebase.files, options)
  pieces = [np.asarray([tokenizer.bos_id], np.int32)] if options.add_bos else []
  starts, ends, sizes, position = [], [], [], len(pieces)
  for doc in docs:
    ids = tokenizer.encode(doc)
    starts.append(position)
    position += len(ids)
    ends.append(position)
    sizes.append(len(doc.encode("utf-8")))
    pieces.append(ids)
  return CodebaseTokens(np.concatenate(pieces).astype(np.int32),
                        tuple(f.path for f in codebase.files), np.asarray(starts, np.int64),
                        np.asarray(ends, np.int64), np.asarray(sizes, np.int64))
