"""Corpus building: filtering, dedup, split by repository, budgets, summary, resume."""

import json
import pathlib

import pytest
from array_record.python import array_record_module

from c2jax.data import corpus, reader, records

from data_testlib import TREE, options


def _all_records(directory: pathlib.Path) -> dict[str, list[dict]]:
  """Every record per split, in manifest (= build) order."""
  result = {split: [] for split in corpus.SPLITS}
  for entry in corpus.read_manifest(directory):
    r = array_record_module.ArrayRecordReader(str(directory / entry["shard"]))
    result[entry["split"]] += [records.decode(raw) for raw in r.read_all()]
    r.close()
  return result


def test_summary_counts_every_kept_and_dropped_file(built):
  summary = built.summary
  dropped = {k: v["files"] for k, v in summary["dropped"].items() if v["files"]}
  assert dropped == {"unknown_language": 3, "binary": 1, "too_large": 1, "empty": 1,
                     "duplicate": 1}
  assert summary["dropped"]["too_large"]["bytes"] == len("x = 1\n" * 400)
  assert summary["splits"]["train"]["documents"] == 6
  assert summary["splits"]["heldout"]["documents"] == 3
  assert summary["heldout_repositories"] == ["gamma"]
  assert summary["splits"]["heldout"]["languages"] == {"python": 2, "go": 1}
  assert summary["this_run"] == {"repositories_processed": 4, "repositories_resumed": 0}


def test_records_carry_metadata_and_exact_text(built):
  got = _all_records(built.directory)
  by_path = {(r["repository"], r["path"]): r for split in got.values() for r in split}
  readme = by_path[("alpha", "README.md")]
  assert readme["language"] == "markdown"
  assert readme["text"] == TREE["alpha"]["README.md"]
  assert by_path[("beta", "src/lib.rs")]["language"] == "rust"
  # Exactly one of the two identical files survives deduplication.
  assert (("alpha", "pkg/core.py") in by_path) + (("beta", "copy_of_core.py") in by_path) == 1
  # The split is by repository: no repository has records in both splits.
  repos = {split: {r["repository"] for r in rs} for split, rs in got.items()}
  assert repos["heldout"] == {"gamma"} and not repos["train"] & repos["heldout"]


def test_duplicate_kept_is_the_first_in_build_order(built):
  first = min(["alpha", "beta"], key=corpus._unit_hash)
  paths = {r["path"] for r in _all_records(built.directory)["train"]}
  assert ("pkg/core.py" in paths) == (first == "alpha")


def test_split_is_deterministic_and_follows_fraction():
  opts = corpus.BuildOptions(heldout_fraction=0.25)
  names = [f"repo{i}" for i in range(2000)]
  splits = [corpus.split_of(n, opts) for n in names]
  assert splits == [corpus.split_of(n, opts) for n in names]
  assert 0.2 < splits.count("heldout") / len(names) < 0.3
  assert corpus.split_of("repo1", corpus.BuildOptions(heldout_fraction=0.0,
                                                      heldout_repositories=("repo1",))) == "heldout"


def test_repository_documents_concatenate_files_alphabetically(built):
  docs = {d["repository"]: d["text"] for d in built.repository_documents("heldout")}
  gamma = TREE["gamma"]
  expected = "".join(f"<<< {p} >>>\n{gamma[p]}" for p in sorted(gamma))
  assert docs == {"gamma": expected}
  files = list(built.file_documents("heldout"))
  assert [f["path"] for f in files] == sorted(gamma)
  assert files[0]["text"] == records.file_text("a.py", gamma["a.py"])


def test_total_budget_stops_the_build(tree, tmp_path):
  summary = corpus.build(tmp_path, options(tree, max_total_bytes=60), progress=False)
  kept = summary["splits"]["train"]["bytes"] + summary["splits"]["heldout"]["bytes"]
  assert kept <= 60
  assert summary["budget_reached"]
  assert summary["dropped"]["over_total_budget"]["files"] >= 1
  assert summary["dropped"]["over_total_budget"]["bytes"] > 0
  assert summary["repositories_not_reached"] + summary["this_run"]["repositories_processed"] == 4


def test_resume_after_a_crash_rebuilds_only_unfinished_repositories(tree, tmp_path):
  # One repository per shard (shard_bytes=1), so a crash can leave some finished.
  opts = options(tree, shard_bytes=1)
  reference = tmp_path / "reference"
  corpus.build(reference, opts, progress=False)
  crashed = tmp_path / "crashed"
  corpus.build(crashed, opts, progress=False)
  # Simulate a kill: the last two shards never got their manifest lines (one line is cut
  # in half), a partial shard is lying around, and the summary was never written.
  lines = (crashed / corpus.MANIFEST).read_bytes().splitlines(keepends=True)
  assert len(lines) == 4
  (crashed / corpus.MANIFEST).write_bytes(b"".join(lines[:2]) + lines[2][:10])
  (crashed / "train-00009.array_record.partial").write_bytes(b"garbage")
  (crashed / corpus.SUMMARY).unlink()
  with pytest.raises(ValueError, match="not a finished corpus"):
    reader.Corpus(crashed)

  summary = corpus.build(crashed, opts, progress=False)
  assert summary["this_run"] == {"repositories_processed": 2, "repositories_resumed": 2}
  assert _all_records(crashed) == _all_records(reference)
  assert not list(crashed.glob("*.partial"))
  ref_summary = json.loads((reference / corpus.SUMMARY).read_text())
  assert summary["splits"] == ref_summary["splits"]
  assert summary["dropped"] == ref_summary["dropped"]
  # A finished build reruns as a no-op.
  again = corpus.build(crashed, opts, progress=False)
  assert again["this_run"] == {"repositories_processed": 0, "repositories_resumed": 4}


def test_rerun_with_other_options_is_refused(tree, tmp_path):
  corpus.build(tmp_path, options(tree), progress=False)
  with pytest.raises(ValueError, match=r"different options \(\['max_file_bytes'\]\)"):
    corpus.build(tmp_path, options(tree, max_file_bytes=5), progress=False)


def test_foreign_records_are_rejected():
  with pytest.raises(ValueError, match="not a c2jax corpus shard"):
    records.decode(b'{"text": "x"}')


def test_bad_options_are_explained():
  with pytest.raises(ValueError, match="heldout_fraction"):
    corpus.BuildOptions(heldout_fraction=1.5).validate()
  with pytest.raises(ValueError, match="max_total_bytes"):
    corpus.BuildOptions(max_total_bytes=0).validate()


def test_each_split_keeps_its_share_of_the_budget(tree, built, tmp_path):
  # A budget the training repositories alone would fill: held-out ones still get their
  # share (heldout_fraction of it; half here), so an early large repository cannot leave the
  # held-out split empty.
  heldout_bytes = built.summary["splits"]["heldout"]["bytes"]
  train_bytes = built.summary["splits"]["train"]["bytes"]
  budget = int(heldout_bytes / 0.5) + 1
  assert 0.5 * budget < train_bytes  # the training split is truncated
  summary = corpus.build(tmp_path, options(tree, max_total_bytes=budget, heldout_fraction=0.5),
                         progress=False)
  heldout = summary["splits"]["heldout"]
  assert heldout["repositories"] >= 1 and 0 < heldout["bytes"] <= 0.5 * budget
  assert 0 < summary["splits"]["train"]["bytes"] <= 0.5 * budget
  assert summary["budget_reached"]
