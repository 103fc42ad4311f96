"""Corpus building: source trees -> deduplicated ArrayRecord shards, split by repository.

Layout of a corpus directory:
  options.json            the BuildOptions it was built with (a rerun must match them)
  manifest.jsonl          one line per finished shard: its split, record count and the
                          repositories in it (record range, bytes, languages, drops)
  {split}-NNNNN.array_record   shards of records (records.py), split in {train, heldout}
  summary.json            what was kept and dropped and why (written when a build ends)

Resumability: a repository is finished only once the shard holding it is renamed into
place and its manifest line is written, so a killed build reruns exactly the unfinished
repositories; shard files the manifest does not list (partial writes) are deleted. The
repository order and dedup set are rebuilt the same way, so a resumed build produces the
same records as an uninterrupted one.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math
import os
import pathlib
from typing import NamedTuple

from array_record.python import array_record_module
from tqdm import tqdm

from c2jax.data import records, sources

SPLITS = ("train", "heldout")
MANIFEST = "manifest.jsonl"
OPTIONS = "options.json"
SUMMARY = "summary.json"
# Reasons a file is left out; summary.json counts files and bytes per reason.
DROP_REASONS = ("unknown_language", "too_large", "binary", "empty", "duplicate",
                "unreadable", "over_total_budget")


@dataclasses.dataclass(frozen=True)
class BuildOptions:
  sources: tuple[str, ...] = sources.DEFAULT_SOURCES
  heldout_fraction: float = 0.05
  heldout_repositories: tuple[str, ...] = ()  # always held out, whatever their hash
  max_file_bytes: int = 256 * 1024
  # None: no limit. Each split has its share: held-out repositories may keep up to
  # heldout_fraction of it (5% when only heldout_repositories are named), training ones
  # the rest, so a large early repository of one split cannot starve the other.
  max_total_bytes: int | None = None
  shard_bytes: int = 64 * 2**20

  def validate(self) -> None:
    if not 0.0 <= self.heldout_fraction < 1.0:
      raise ValueError(f"heldout_fraction is {self.heldout_fraction}; use a value in [0, 1).")
    for name in ("max_file_bytes", "shard_bytes"):
      if getattr(self, name) <= 0:
        raise ValueError(f"{name} is {getattr(self, name)}; it must be > 0.")
    if self.max_total_bytes is not None and self.max_total_bytes <= 0:
      raise ValueError(f"max_total_bytes is {self.max_total_bytes}; use > 0, or None for "
                       "no limit.")

  def split_budgets(self) -> dict[str, float] | None:
    """Bytes each split may keep, or None without a total budget."""
    if self.max_total_bytes is None:
      return None
    share = self.heldout_fraction or (0.05 if self.heldout_repositories else 0.0)
    return {"heldout": share * self.max_total_bytes,
            "train": (1.0 - share) * self.max_total_bytes}

  def to_json(self) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(self).items()}


def _unit_hash(text: str) -> float:
  return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def split_of(repository: str, options: BuildOptions) -> str:
  """Deterministic by the repository's name, so a repository never straddles splits."""
  if repository in options.heldout_repositories:
    return "heldout"
  return "heldout" if _unit_hash("heldout:" + repository) < options.heldout_fraction else "train"


def read_manifest(out: pathlib.Path) -> list[dict]:
  """Complete manifest lines; a line cut short by a crash (and anything after) is dropped."""
  path = out / MANIFEST
  if not path.exists():
    return []
  entries, valid_bytes = [], 0
  with open(path, "rb") as f:
    for line in f:
      try:
        entry = json.loads(line)
      except json.JSONDecodeError:
        break
      if not line.endswith(b"\n"):
        break
      entries.append(entry)
      valid_bytes += len(line)
  if valid_bytes != path.stat().st_size:
    with open(path, "r+b") as f:
      f.truncate(valid_bytes)
  for entry in entries:
    if not (out / entry["shard"]).exists():
      raise ValueError(f"corpus {out} is damaged: {MANIFEST} lists {entry['shard']} but the "
                       "file is missing. Delete the directory and build again.")
  return entries


class _ShardWriter:
  """Writes one shard under a temporary name; `finish` publishes it and its manifest line."""

  def __init__(self, out: pathlib.Path, split: str, index: int):
    self.out, self.split = out, split
    self.name = f"{split}-{index:05d}.array_record"
    self.partial = out / (self.name + ".partial")
    self.writer = array_record_module.ArrayRecordWriter(str(self.partial), "group_size:1")
    self.count = 0
    self.bytes = 0
    self.repositories: list[dict] = []

  def write(self, record: bytes, text_bytes: int) -> None:
    self.writer.write(record)
    self.count += 1
    self.bytes += text_bytes

  def finish(self) -> dict:
    self.writer.close()
    os.replace(self.partial, self.out / self.name)
    entry = {"shard": self.name, "split": self.split, "records": self.count,
             "repositories": self.repositories}
    with open(self.out / MANIFEST, "a", encoding="utf-8") as f:
      f.write(json.dumps(entry) + "\n")
      f.flush()
      os.fsync(f.fileno())
    return entry


def _prepare_directory(out: pathlib.Path, options: BuildOptions) -> list[dict]:
  out.mkdir(parents=True, exist_ok=True)
  options_path = out / OPTIONS
  wanted = options.to_json()
  if options_path.exists():
    saved = json.loads(options_path.read_text())
    if saved != wanted:
      changed = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
      raise ValueError(f"{out} holds a corpus built with different options ({changed}); "
                       "pass the same options to resume it, or choose another --out.")
  else:
    options_path.write_text(json.dumps(wanted, indent=1))
  # No summary while a build runs: readers (reader.Corpus) wait for a finished corpus.
  (out / SUMMARY).unlink(missing_ok=True)
  manifest = read_manifest(out)
  listed = {entry["shard"] for entry in manifest}
  for path in out.iterdir():
    if path.name.endswith((".array_record", ".partial")) and path.name not in listed:
      path.unlink()  # a shard written by a killed build: never trusted
  return manifest


class _Kept(NamedTuple):
  language: str
  sha256: str
  text: str
  size: int


class _Dropped(NamedTuple):
  reason: str
  size: int


def _read_file(repo: sources.Repository, path: str, options: BuildOptions,
               seen: set[str]) -> _Kept | _Dropped:
  language = sources.language_of(path)
  full = repo.root / path
  try:
    size = full.stat().st_size
    if language is None:
      return _Dropped("unknown_language", size)
    if size > options.max_file_bytes:
      return _Dropped("too_large", size)
    data = full.read_bytes()
  except OSError:
    return _Dropped("unreadable", 0)
  if b"\0" in data:
    return _Dropped("binary", len(data))
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError:
    return _Dropped("binary", len(data))
  if not text.strip():
    return _Dropped("empty", len(data))
  digest = hashlib.sha256(data).hexdigest()
  if digest in seen:
    return _Dropped("duplicate", len(data))
  return _Kept(language, digest, text, len(data))


def _build_repository(repo: sources.Repository, split: str, writer: _ShardWriter,
                      options: BuildOptions, seen: set[str], budget_left: float) -> dict:
  """Writes a repository's kept files; stops (truncated) where its split's budget ends."""
  stats = {"name": repo.name, "split": split, "first": writer.count, "count": 0,
           "bytes": 0, "languages": {}, "dropped": {}, "truncated": False}
  dropped = collections.defaultdict(lambda: [0, 0])
  for i, path in enumerate(repo.files):
    result = _read_file(repo, path, options, seen)
    if isinstance(result, _Dropped):
      dropped[result.reason][0] += 1
      dropped[result.reason][1] += result.size
      continue
    language, digest, text, size = result
    if size > budget_left:
      # The split's budget ends here: this and the repository's remaining files are
      # dropped, later repositories of this split are not reached.
      rest = repo.files[i:]
      dropped["over_total_budget"][0] += len(rest)
      dropped["over_total_budget"][1] += sum(
          (repo.root / p).stat().st_size for p in rest if (repo.root / p).is_file())
      stats["truncated"] = True
      break
    seen.add(digest)
    writer.write(records.encode(repo.name, path, language, digest, text), size)
    budget_left -= size
    stats["count"] += 1
    stats["bytes"] += size
    stats["languages"][language] = stats["languages"].get(language, 0) + 1
  stats["dropped"] = dict(dropped)
  return stats


def build(out: str | os.PathLike, options: BuildOptions = BuildOptions(), *,
          progress: bool = True) -> dict:
  """Builds (or resumes building) a corpus in `out`; returns the summary it writes."""
  options.validate()
  out = pathlib.Path(out)
  manifest = _prepare_directory(out, options)
  finished = {repo["name"]: repo for entry in manifest for repo in entry["repositories"]}
  seen: set[str] = set()
  for entry in manifest:
    reader = array_record_module.ArrayRecordReader(str(out / entry["shard"]))
    seen.update(records.decode(raw)["sha256"] for raw in reader.read_all())
    reader.close()
  budgets = options.split_budgets()
  left = {split: math.inf if budgets is None else budgets[split] for split in SPLITS}
  full = {split: budgets is not None and budgets[split] <= 0 for split in SPLITS}
  for repo in finished.values():
    left[repo["split"]] -= repo["bytes"]
    full[repo["split"]] |= repo["truncated"]
  kept_total = sum(repo["bytes"] for repo in finished.values())
  next_index = {split: sum(e["split"] == split for e in manifest) for split in SPLITS}

  repos = sorted(sources.discover(options.sources), key=lambda r: _unit_hash(r.name))
  writers: dict[str, _ShardWriter | None] = {split: None for split in SPLITS}
  processed = not_reached = 0
  bar = tqdm(repos, desc="corpus", unit="repo", disable=not progress)
  for repo in bar:
    if repo.name in finished:
      continue
    if all(full.values()):
      not_reached += 1
      continue
    split = split_of(repo.name, options)
    if full[split]:
      not_reached += 1
      continue
    if writers[split] is None:
      writers[split] = _ShardWriter(out, split, next_index[split])
      next_index[split] += 1
    writer = writers[split]
    stats = _build_repository(repo, split, writer, options, seen, left[split])
    writer.repositories.append(stats)
    kept_total += stats["bytes"]
    left[split] -= stats["bytes"]
    full[split] = stats["truncated"]
    processed += 1
    bar.set_postfix(kept=f"{kept_total / 2**20:.1f}MiB", refresh=False)
    if writer.bytes >= options.shard_bytes:
      manifest.append(writer.finish())
      writers[split] = None
  for split, writer in writers.items():
    if writer is not None:
      manifest.append(writer.finish())

  summary = summarize(manifest, options)
  summary["repositories_not_reached"] = not_reached
  summary["this_run"] = {"repositories_processed": processed,
                         "repositories_resumed": len(finished)}
  tmp = out / (SUMMARY + ".tmp")
  tmp.write_text(json.dumps(summary, indent=1, sort_keys=True))
  os.replace(tmp, out / SUMMARY)
  return summary


def summarize(manifest: list[dict], options: BuildOptions) -> dict:
  splits = {s: {"repositories": 0, "documents": 0, "bytes": 0, "languages": {}}
            for s in SPLITS}
  dropped = {reason: {"files": 0, "bytes": 0} for reason in DROP_REASONS}
  heldout, truncated = [], False
  for entry in manifest:
    for repo in entry["repositories"]:
      split = splits[repo["split"]]
      split["repositories"] += 1
      split["documents"] += repo["count"]
      split["bytes"] += repo["bytes"]
      for language, n in repo["languages"].items():
        split["languages"][language] = split["languages"].get(language, 0) + n
      for reason, (files, size) in repo["dropped"].items():
        dropped[reason]["files"] += files
        dropped[reason]["bytes"] += size
      if repo["split"] == "heldout":
        heldout.append(repo["name"])
      truncated |= repo["truncated"]
  return {"splits": splits, "dropped": dropped, "heldout_repositories": sorted(heldout),
          "budget_reached": truncated, "options": options.to_json()}
