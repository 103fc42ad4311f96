"""Reading a built corpus: file documents and repository-level documents per split.

Both are random-access grain `MapDataset`s, so the pipelines can shuffle, shard and
checkpoint them by index. Repository documents use the record ranges the manifest keeps
per repository (a repository's files are contiguous and in path order in its shard).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pathlib
import typing

from c2jax.data import corpus, records

if typing.TYPE_CHECKING:
  import grain


def _grain():
  # Imported when a dataset is first built: grain (with orbax) takes most of a second to
  # import, and the many processes that only tokenize (actors, servers) never need it.
  return importlib.import_module("grain")


@dataclasses.dataclass(frozen=True)
class RepositoryEntry:
  name: str
  start: int  # index of its first record in the split's data source
  count: int


class _RepositoryText:
  """Picklable map: repository entry -> its files concatenated in path order."""

  def __init__(self, source: grain.sources.ArrayRecordDataSource):
    self._source = source

  def __call__(self, entry: RepositoryEntry) -> dict[str, str]:
    files = [records.decode(self._source[entry.start + i]) for i in range(entry.count)]
    return {"repository": entry.name, "text": records.repository_text(files)}


def _file_document(raw: bytes) -> dict[str, str]:
  record = records.decode(raw)
  return {"repository": record["repository"], "path": record["path"],
          "text": records.file_text(record["path"], record["text"])}


class Corpus:
  """A finished corpus directory (see corpus.py for its layout)."""

  def __init__(self, directory: str | pathlib.Path):
    self.directory = pathlib.Path(directory)
    if not (self.directory / corpus.SUMMARY).exists():
      raise ValueError(f"{self.directory} is not a finished corpus (no {corpus.SUMMARY}); "
                       f"run `c2jax data build --out {self.directory}` (it resumes).")
    self.summary = json.loads((self.directory / corpus.SUMMARY).read_text())
    self._manifest = corpus.read_manifest(self.directory)

  def _entries(self, split: str) -> list[dict]:
    if split not in corpus.SPLITS:
      raise ValueError(f"unknown split {split!r}; expected one of {corpus.SPLITS}.")
    return [e for e in self._manifest if e["split"] == split]

  def source(self, split: str) -> grain.sources.ArrayRecordDataSource:
    entries = [e for e in self._entries(split) if e["records"]]
    if not entries:
      raise ValueError(f"corpus {self.directory} has no {split} documents (see "
                       f"{corpus.SUMMARY}); add sources or change the held-out fraction.")
    return _grain().sources.ArrayRecordDataSource(
        [str(self.directory / e["shard"]) for e in entries])

  def repositories(self, split: str) -> list[RepositoryEntry]:
    result, offset = [], 0
    for entry in self._entries(split):
      for repo in entry["repositories"]:
        if repo["count"]:
          result.append(RepositoryEntry(repo["name"], offset + repo["first"], repo["count"]))
      offset += entry["records"]
    return result

  def file_documents(self, split: str) -> grain.MapDataset:
    """One element per file: {repository, path, text (with its path header)}."""
    return _grain().MapDataset.source(self.source(split)).map(_file_document)

  def repository_documents(self, split: str) -> grain.MapDataset:
    """One element per repository: {repository, text (files in path order)}."""
    source = self.source(split)
    return _grain().MapDataset.source(self.repositories(split)).map(_RepositoryText(source))

  def texts(self, split: str, max_bytes: int | None = None):
    """Yields file-document texts in corpus order, up to about `max_bytes` (tokenizer
    training)."""
    total = 0
    for document in self.file_documents(split):
      if max_bytes is not None and total >= max_bytes:
        return
      total += len(document["text"].encode("utf-8"))
      yield document["text"]
