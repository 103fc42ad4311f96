"""The document format shared by the corpus writer and readers.

One ArrayRecord record is one source file, stored as UTF-8 JSON:
  {"repository": str, "path": str, "language": str, "sha256": str, "text": str}
(`sha256` of the file's bytes is what deduplication and resume rely on.)

A document's training text puts the file's path in front of its contents; a
repository-level document is its files' texts concatenated in path order, which is the
layout of the codebase-perplexity eval (files of one repository concatenated
alphabetically) and of long-context training on whole repositories.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

FILE_HEADER = "<<< {path} >>>\n"
FIELDS = ("repository", "path", "language", "sha256", "text")


def encode(repository: str, path: str, language: str, sha256: str, text: str) -> bytes:
  record = {"repository": repository, "path": path, "language": language,
            "sha256": sha256, "text": text}
  return json.dumps(record, ensure_ascii=False).encode("utf-8")


def decode(raw: bytes) -> dict[str, str]:
  record = json.loads(raw)
  if not isinstance(record, dict) or set(record) != set(FIELDS):
    got = sorted(record) if isinstance(record, dict) else type(record).__name__
    raise ValueError(f"corpus record has fields {got}, expected {sorted(FIELDS)}: the shard "
                     "is not a c2jax corpus shard (rebuild it with `c2jax data build`).")
  return record


def file_text(path: str, text: str) -> str:
  """A file as one document: header with its path, then its text ending in a newline."""
  return FILE_HEADER.format(path=path) + text + ("" if text.endswith("\n") else "\n")


def repository_text(records: Iterable[Mapping[str, str]]) -> str:
  """Files of one repository concatenated alphabetically by path, each with its header."""
  ordered = sorted(records, key=lambda r: r["path"])
  return "".join(file_text(r["path"], r["text"]) for r in ordered)
