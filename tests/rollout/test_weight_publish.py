"""Weight publishing by deltas: bit-exact rebuilds, skipped writes, GC, crashes, corruption.

Run as a script (`python test_weight_publish.py DIR LAST SLEEP_S`), this file is the
publisher process of the cross-process tests: it publishes versions 1..LAST of
`_tree(version)` (forever when LAST is 0).
"""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from c2jax.rollout import weights

REPO = pathlib.Path(__file__).resolve().parents[2]
# leaf path -> (shape, dtype, changes every N versions; 0 = never)
_LEAVES = {
    "dense/kernel": ((8, 16), np.float32, 1),
    "dense/scale": ((16,), ml_dtypes.bfloat16, 2),
    "embed/table": ((32, 4), ml_dtypes.bfloat16, 3),
    "frozen/bias": ((4,), np.float32, 0),
    "step": ((), np.int32, 1),
}
# bf16 values float subtraction cannot carry through a delta: NaN payloads, -0, inf, tiny.
_SPECIAL_BF16_BITS = np.array([0x7FC1, 0xFFC3, 0x8000, 0x0000, 0x7F80, 0xFF80, 0x0001, 0x8001],
                              np.uint16)


def _leaf(path: str, version: int) -> np.ndarray:
  shape, dtype, every = _LEAVES[path]
  epoch = version // every if every else 0
  if dtype == np.int32:
    return np.array(epoch, np.int32)
  rng = np.random.default_rng([sorted(_LEAVES).index(path), epoch])
  value = (rng.standard_normal(shape) * 0.02).astype(dtype)
  if path == "dense/scale":
    value.view(np.uint16)[:len(_SPECIAL_BF16_BITS)] = _SPECIAL_BF16_BITS
  return value


def _tree(version: int) -> dict:
  return weights.unflatten({p: _leaf(p, version) for p in _LEAVES})


def _assert_bit_exact(got, want):
  got_flat, want_flat = weights.flatten(got), weights.flatten(want)
  assert got_flat.keys() == want_flat.keys()
  for path, expected in want_flat.items():
    actual = np.asarray(got_flat[path])
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, path
    assert actual.tobytes() == expected.tobytes(), path


def _manifest(root: pathlib.Path, version: int) -> dict:
  return json.loads((root / "manifests" / f"{version:012d}.json").read_text())


def _written_leaves(root: pathlib.Path, version: int) -> set[str]:
  base = root / "arrays" / f"{version:012d}"
  return {str(p.parent.relative_to(base)) for p in base.rglob("zarr.json")}


def _array_versions(root: pathlib.Path) -> list[int]:
  return sorted(int(p.name) for p in (root / "arrays").iterdir())


def test_round_trip_bit_exact_over_versions(tmp_path):
  publisher = weights.WeightPublisher(tmp_path, full_every=4)
  follower = weights.WeightSubscriber(tmp_path)
  kinds = []
  for version in range(1, 7):
    kinds.append(publisher.publish(_tree(version), version)["kind"])
    _assert_bit_exact(follower.load(), _tree(version))
    _assert_bit_exact(weights.WeightSubscriber(tmp_path).load(version), _tree(version))
  assert kinds == ["full", "delta", "delta", "delta", "full", "delta"]
  assert follower.version == 6


def test_unchanged_leaves_and_chunks_not_written(tmp_path):
  publisher = weights.WeightPublisher(tmp_path, chunk_bytes=256)  # 4 rows of 16 f32
  tree = {"big": np.zeros((64, 16), np.float32), "small": np.ones(3, np.float32)}
  publisher.publish(tree, 1)
  changed = {"big": tree["big"].copy(), "small": tree["small"]}
  changed["big"][9, 3] = 0.5  # row 9 lives in chunk 2
  manifest = publisher.publish(changed, 2)
  assert {p: e["encoding"] for p, e in manifest["leaves"].items()} == {
      "big": "xor", "small": "unchanged"}
  assert _written_leaves(tmp_path, 2) == {"big"}
  chunk_files = [p for p in (tmp_path / "arrays" / f"{2:012d}" / "big").rglob("*")
                 if p.is_file() and p.name != "zarr.json"]
  assert [p.relative_to(tmp_path / "arrays" / f"{2:012d}" / "big").parts
          for p in chunk_files] == [("c", "2", "0")]
  _assert_bit_exact(weights.WeightSubscriber(tmp_path).load(2), changed)


def test_subscriber_catches_up_then_reads_only_new_deltas(tmp_path):
  publisher = weights.WeightPublisher(tmp_path, full_every=100)
  for version in (1, 2, 3):
    publisher.publish(_tree(version), version)
  subscriber = weights.WeightSubscriber(tmp_path)
  _assert_bit_exact(subscriber.load(), _tree(3))  # full 1 + deltas 2, 3
  publisher.publish(_tree(4), 4)
  # Versions 1-3 vanish: only a subscriber that reads nothing but version 4 still works.
  for version in (1, 2, 3):
    (tmp_path / "manifests" / f"{version:012d}.json").unlink()
  subscriber_params, version = subscriber.poll()
  assert version == 4
  _assert_bit_exact(subscriber_params, _tree(4))
  with pytest.raises(weights.WeightSyncError, match="version 3 .*needed to rebuild 4"):
    weights.WeightSubscriber(tmp_path).load(4)


def test_poll_returns_only_newer_versions(tmp_path):
  subscriber = weights.WeightSubscriber(tmp_path)
  assert subscriber.poll() is None and subscriber.latest_version() is None
  with pytest.raises(weights.WeightSyncError, match="No complete weights version"):
    subscriber.load()
  publisher = weights.WeightPublisher(tmp_path)
  publisher.publish(_tree(1), 1)
  params, version = subscriber.poll()
  assert version == 1
  _assert_bit_exact(params, _tree(1))
  assert subscriber.poll() is None
  publisher.publish(_tree(5), 5)
  assert subscriber.poll()[1] == 5


def test_subscriber_survives_a_wiped_directory_reusing_versions(tmp_path):
  first_run = weights.WeightPublisher(tmp_path)
  first_run.publish(_tree(1), 1)
  first_run.publish(_tree(2), 2)
  subscriber = weights.WeightSubscriber(tmp_path)
  assert subscriber.poll()[1] == 2
  shutil.rmtree(tmp_path)
  second_run = weights.WeightPublisher(tmp_path)
  for version in (1, 2, 3):  # version 3's base is "2", but not the 2 the subscriber holds
    second_run.publish(_tree(version + 10), version)
  params, version = subscriber.poll()
  assert version == 3
  _assert_bit_exact(params, _tree(13))


def test_half_written_version_is_ignored_and_republished_cleanly(tmp_path):
  crashed = weights.WeightPublisher(tmp_path)
  crashed.publish(_tree(1), 1)
  crashed.publish(_tree(2), 2)
  crashed.publish(_tree(3), 3)
  (tmp_path / "manifests" / f"{3:012d}.json").unlink()  # killed before its manifest
  subscriber = weights.WeightSubscriber(tmp_path)
  assert subscriber.latest_version() == 2
  assert subscriber.poll()[1] == 2
  # The restarted publisher rewrites version 3; an all-zero leaf writes no chunk, so a
  # leftover chunk of the crashed attempt would be read in its place if not cleared.
  restarted = weights.WeightPublisher(tmp_path)
  assert restarted.version == 2
  retry = _tree(3)
  retry["dense"]["kernel"] = np.zeros_like(retry["dense"]["kernel"])
  assert restarted.publish(retry, 3)["kind"] == "full"
  params, version = subscriber.poll()
  assert version == 3
  _assert_bit_exact(params, retry)


def test_full_snapshots_garbage_collect_older_versions(tmp_path):
  publisher = weights.WeightPublisher(tmp_path, full_every=3)
  early = weights.WeightSubscriber(tmp_path)
  expected_kept = {1: [1], 2: [1, 2], 3: [1, 2, 3], 4: [4], 5: [4, 5], 6: [4, 5, 6], 7: [7]}
  for version in range(1, 8):
    publisher.publish(_tree(version), version)
    assert weights.list_versions(weights.open_store(tmp_path)) == expected_kept[version]
    assert _array_versions(tmp_path) == expected_kept[version]
    _assert_bit_exact(weights.WeightSubscriber(tmp_path).load(), _tree(version))
    if version == 2:
      early.load()
  # A subscriber left at version 2 jumps to the newest chain.
  params, version = early.poll()
  assert version == 7
  _assert_bit_exact(params, _tree(7))
  with pytest.raises(weights.WeightSyncError, match="garbage-collected"):
    weights.WeightSubscriber(tmp_path).load(5)


@pytest.fixture
def two_versions(tmp_path):
  publisher = weights.WeightPublisher(tmp_path)
  publisher.publish(_tree(1), 1)
  publisher.publish(_tree(2), 2)
  return tmp_path


def _chunk_file(root, version, leaf):
  files = [p for p in (root / "arrays" / f"{version:012d}" / leaf).rglob("*")
           if p.is_file() and p.name != "zarr.json"]
  assert files
  return files[0]


def test_corrupt_chunk_names_version_and_leaf(two_versions):
  _chunk_file(two_versions, 2, "dense/kernel").write_bytes(b"not a blosc frame")
  with pytest.raises(weights.WeightSyncError,
                     match=r"version 2, leaf 'dense/kernel'.*full=True"):
    weights.WeightSubscriber(two_versions).load(2)


def test_missing_chunk_fails_the_checksum(two_versions):
  _chunk_file(two_versions, 2, "dense/kernel").unlink()  # reads back as zeros
  with pytest.raises(weights.WeightSyncError, match=r"leaf 'dense/kernel'.*checksum"):
    weights.WeightSubscriber(two_versions).load(2)


def test_missing_array_names_version_and_leaf(two_versions):
  (two_versions / "arrays" / f"{1:012d}" / "embed" / "table" / "zarr.json").unlink()
  with pytest.raises(weights.WeightSyncError, match=r"version 1, leaf 'embed/table'"):
    weights.WeightSubscriber(two_versions).load(2)


def test_structure_changes_are_errors(two_versions):
  publisher = weights.WeightPublisher(two_versions / "other")
  publisher.publish(_tree(1), 1)
  grown = _tree(2)
  grown["dense"]["extra"] = np.ones(2, np.float32)
  with pytest.raises(ValueError, match=r"differs from version 1: new \['dense/extra'\]"):
    publisher.publish(grown, 2)
  recast = _tree(2)
  recast["frozen"]["bias"] = recast["frozen"]["bias"].astype(np.float16)
  with pytest.raises(ValueError, match="frozen/bias: .*float32.*float16"):
    publisher.publish(recast, 2)
  with pytest.raises(ValueError, match="not newer than the last published version 1"):
    publisher.publish(_tree(1), 1)
  # A delta whose manifest disagrees with its base is refused on the reading side too.
  path = two_versions / "manifests" / f"{2:012d}.json"
  manifest = json.loads(path.read_text())
  del manifest["leaves"]["frozen/bias"]
  path.write_text(json.dumps(manifest))
  with pytest.raises(weights.WeightSyncError,
                     match=r"changes the tree .*missing \['frozen/bias'\]"):
    weights.WeightSubscriber(two_versions).load(2)


def test_load_like_returns_its_structure(two_versions):
  like = jax.tree_util.tree_map(jnp.asarray, _tree(0))
  params = weights.WeightSubscriber(two_versions).load(2, like=like)
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(like)
  assert all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(params))
  _assert_bit_exact(params, _tree(2))
  like["dense"]["kernel"] = jnp.zeros((8, 15), jnp.float32)
  with pytest.raises(ValueError, match=r"'dense/kernel' is float32\[8, 15\]"):
    weights.WeightSubscriber(two_versions).load(2, like=like)


def _start_publisher(root, last: int, sleep_s: float):
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  return subprocess.Popen([sys.executable, __file__, str(root), str(last), str(sleep_s)],
                          env=env)


def test_subscriber_follows_a_publisher_process(tmp_path):
  publisher = _start_publisher(tmp_path, 5, 0.2)
  subscriber, seen = weights.WeightSubscriber(tmp_path), []
  try:
    deadline = time.monotonic() + 60
    while subscriber.version != 5:
      assert time.monotonic() < deadline, "publisher process made no progress"
      update = subscriber.poll()
      if update is not None:
        _assert_bit_exact(update[0], _tree(update[1]))
        seen.append(update[1])
      time.sleep(0.02)
    assert publisher.wait(timeout=30) == 0
  finally:
    if publisher.poll() is None:
      publisher.kill()
  assert seen == sorted(seen) and len(seen) >= 2


def test_publisher_killed_mid_stream_leaves_only_complete_versions(tmp_path):
  publisher = _start_publisher(tmp_path, 0, 0.0)
  subscriber = weights.WeightSubscriber(tmp_path)
  try:
    deadline = time.monotonic() + 60
    while (subscriber.latest_version() or 0) < 4:
      assert time.monotonic() < deadline, "publisher process made no progress"
      time.sleep(0.01)
  finally:
    os.kill(publisher.pid, signal.SIGKILL)
    publisher.wait()
  latest = subscriber.latest_version()
  _assert_bit_exact(subscriber.load(), _tree(latest))
  assert _array_versions(tmp_path)[-1] in (latest, latest + 1)


def _publish_forever(root: str, last: int, sleep_s: float):
  publisher = weights.WeightPublisher(root, full_every=3)
  version = 1
  while last == 0 or version <= last:
    publisher.publish(_tree(version), version)
    version += 1
    time.sleep(sleep_s)


if __name__ == "__main__":
  _publish_forever(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
