"""Weight publishing by deltas: the learner publishes every step, actors rebuild.

    publisher = WeightPublisher("/shared/weights", full_every=16)
    publisher.publish(params, version=step)            # learner, after each RL step
    subscriber = WeightSubscriber("/shared/weights")
    update = subscriber.poll(like=params)              # actor, between decode steps
    if update is not None:
      params, version = update

Layout under DIRECTORY (a local path, or any tensorstore kvstore URL: `file:///...`,
`gs://bucket/prefix/`, `s3://bucket/prefix/`; object stores work the same because every
step below is a whole-object write, list or delete):

  arrays/<version>/<leaf path>/   one zarr3 array per leaf that this version wrote
  manifests/<version>.json        written last; a version exists once its manifest does

A manifest names its kind (`full` snapshot or `delta`), its `base` version (the previous
publish, or null), the random `snapshot_id` of the full snapshot its chain starts from,
and per leaf path: dtype, shape, encoding and a crc32 of the leaf's bits after this
version. Encodings: `raw` (the bits), `xor` (new bits XOR base bits) and
`unchanged` (nothing written). Each manifest is one kvstore write: the file driver writes
it to a `.__lock` temporary and renames it into place, and an object-store PUT is atomic,
so a publisher killed mid-version leaves arrays without a manifest, which readers ignore
and the next publish of that version (or the next full snapshot's GC) deletes.

Why XOR of the raw bits: it is exactly invertible for every dtype (bf16, fp8, ints, NaN
payloads, -0.0), where float subtraction rounds. Small optimizer steps leave sign,
exponent and high mantissa bits unchanged, so XOR words are mostly zero bits (blosc
byte-shuffle + zstd compresses them to ~1-2% of raw at 1% of entries changed, ~45% when
every entry moved slightly), and a chunk whose XOR is all zero equals the zarr fill value
and is not stored at all (tensorstore skips fill-value chunks). The crc32 per leaf catches
a missing or corrupt chunk on load.

A full snapshot every `full_every` publishes bounds the chain a new actor must replay;
right after one is written, every older version is deleted (so the directory holds the
newest full snapshot and the deltas that follow it).
"""

from __future__ import annotations

import json
import re
import uuid
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from c2jax import storage

FORMAT = "c2jax.weights/1"
_DIGITS = 12
_MANIFEST_RE = re.compile(rf"manifests/(\d{{{_DIGITS}}})\.json")
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_UINT_BY_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class WeightSyncError(RuntimeError):
  """Stored weights are missing, incomplete or corrupt."""


def open_store(directory) -> ts.KvStore:
  """The kvstore rooted at `directory` (local path or URL: c2jax.storage)."""
  return ts.KvStore.open(storage.kvstore_spec(directory)).result()


def _manifest_key(version: int) -> str:
  return f"manifests/{version:0{_DIGITS}d}.json"


def _arrays_key(version: int) -> str:
  return f"arrays/{version:0{_DIGITS}d}"


def _check_version(version) -> int:
  if not isinstance(version, (int, np.integer)) or not 0 <= version < 10**_DIGITS:
    raise ValueError(f"version must be an integer in [0, 10**{_DIGITS}) (e.g. the RL "
                     f"step), got {version!r}.")
  return int(version)


def _key_name(entry) -> str:
  for attr in ("key", "name", "idx"):  # DictKey, GetAttrKey, SequenceKey
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def flatten(tree) -> dict[str, object]:
  """{'a/b/c': leaf} for a pytree; path components must be file-name safe."""
  flat = {}
  for key_path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    names = [_key_name(k) for k in key_path]
    if not names or not all(_NAME_RE.fullmatch(n) for n in names):
      raise ValueError(f"Parameter path {names!r} cannot name files: every key must be "
                       "letters, digits, '_', '-', '.', not starting with '.' (and the "
                       "tree must be a container, not a bare array).")
    flat["/".join(names)] = leaf
  return flat


def unflatten(flat: dict[str, object]) -> dict:
  """The nested dict of `flatten`'s paths."""
  tree: dict = {}
  for path, value in flat.items():
    *parents, name = path.split("/")
    node = tree
    for key in parents:
      node = node.setdefault(key, {})
    node[name] = value
  return tree


def _host_bits(path: str, leaf) -> tuple[np.ndarray, str]:
  """(host copy of the leaf viewed as unsigned ints of its width, dtype name)."""
  if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
    raise ValueError(f"Leaf {path!r} spans several processes; gather it to one host "
                     "(e.g. jax.experimental.multihost_utils.process_allgather) first.")
  # Copies a mutable numpy input: the publisher diffs the next publish against it.
  value = np.array(leaf, copy=True) if isinstance(leaf, np.ndarray) else np.asarray(leaf)
  value = np.require(value, requirements="C")  # keeps 0-d leaves 0-d, unlike ascontiguousarray
  if value.dtype.itemsize not in _UINT_BY_SIZE or value.dtype.kind == "O":
    raise ValueError(f"Leaf {path!r} has dtype {value.dtype}, which cannot be published "
                     "bit-exactly; use a numeric dtype of 1, 2, 4 or 8 bytes.")
  return value.view(_UINT_BY_SIZE[value.dtype.itemsize]), value.dtype.name


def _crc(bits: np.ndarray) -> int:
  return zlib.crc32(memoryview(bits).cast("B"))


def _chunk_shape(shape, itemsize: int, chunk_bytes: int) -> list[int]:
  """Split the leading axes until a chunk holds at most ~chunk_bytes (>=1 element)."""
  chunk = [max(1, d) for d in shape]
  for axis in range(len(chunk)):
    inner = int(np.prod(chunk[axis + 1:], dtype=np.int64)) * itemsize
    if inner * chunk[axis] <= chunk_bytes:
      break
    chunk[axis] = max(1, chunk_bytes // inner)
  return chunk


def _zarr_spec(store: ts.KvStore, version: int, path: str) -> dict:
  kvstore = store / f"{_arrays_key(version)}/{path}/"
  return {"driver": "zarr3", "kvstore": kvstore.spec().to_json()}


def _structure(leaves: dict) -> dict[str, tuple[str, tuple[int, ...]]]:
  return {p: (m["dtype"], tuple(m["shape"])) for p, m in leaves.items()}


def _describe_mismatch(old: dict, new: dict) -> str:
  missing, extra = sorted(old.keys() - new.keys()), sorted(new.keys() - old.keys())
  changed = sorted(p for p in old.keys() & new.keys() if old[p] != new[p])
  parts = [f"missing {missing[:3]}" if missing else "", f"new {extra[:3]}" if extra else "",
           "; ".join(f"{p}: {old[p]} -> {new[p]}" for p in changed[:3])]
  return "; ".join(p for p in parts if p)


class WeightPublisher:
  """Writes successive parameter trees as full snapshots and XOR deltas (module doc).

  Versions must increase. The first publish of a publisher is a full snapshot (it has no
  base in memory), then every `full_every`-th. One process publishes to a directory.
  """

  def __init__(self, directory, *, full_every: int = 16, chunk_bytes: int = 4 << 20,
               zstd_level: int = 1):
    if full_every < 1 or chunk_bytes < 1:
      raise ValueError(f"WeightPublisher needs full_every >= 1 and chunk_bytes >= 1 "
                       f"(got {full_every}, {chunk_bytes}).")
    self.directory, self.full_every = directory, full_every
    self._chunk_bytes, self._zstd_level = chunk_bytes, zstd_level
    self._store = open_store(directory)
    self._bits: dict[str, np.ndarray] | None = None
    self._leaves: dict[str, dict] = {}
    self._since_full, self._snapshot_id = 0, ""
    versions = list_versions(self._store)
    self.version: int | None = versions[-1] if versions else None

  def publish(self, params, version: int, *, full: bool = False) -> dict:
    """Publishes `params` as `version`; returns the manifest written."""
    version = _check_version(version)
    if self.version is not None and version <= self.version:
      raise ValueError(f"version {version} is not newer than the last published version "
                       f"{self.version} in {self.directory}; publish increasing versions "
                       "(or publish to a fresh directory after rolling training back).")
    bits, dtypes = {}, {}
    for path, leaf in flatten(params).items():
      bits[path], dtypes[path] = _host_bits(path, leaf)
    structure = {p: (dtypes[p], b.shape) for p, b in bits.items()}
    if self._bits is not None and structure != _structure(self._leaves):
      mismatch = _describe_mismatch(_structure(self._leaves), structure)
      raise ValueError(f"The parameter tree of version {version} differs from version "
                       f"{self.version}: {mismatch}. Publish a changed model to a new "
                       "directory.")
    is_full = full or self._bits is None or self._since_full + 1 >= self.full_every
    leaves, writes = {}, {}
    for path, new in bits.items():
      entry = {"dtype": dtypes[path], "shape": list(new.shape)}
      if is_full:
        writes[path], entry["encoding"], entry["crc32"] = new, "raw", _crc(new)
      else:
        delta = np.bitwise_xor(new, self._bits[path])
        if delta.any():
          writes[path], entry["encoding"], entry["crc32"] = delta, "xor", _crc(new)
        else:
          entry["encoding"], entry["crc32"] = "unchanged", self._leaves[path]["crc32"]
      leaves[path] = entry
    # Debris of a publisher killed while writing this version must not mix with ours.
    prefix = _arrays_key(version)
    self._store.delete_range(ts.KvStore.KeyRange(prefix, prefix + "0")).result()
    self._write_arrays(version, writes)
    if is_full:
      self._snapshot_id = uuid.uuid4().hex
    manifest = {"format": FORMAT, "version": version, "kind": "full" if is_full else "delta",
                "base": None if is_full else self.version, "snapshot_id": self._snapshot_id,
                "leaves": leaves}
    self._store.write(_manifest_key(version), json.dumps(manifest).encode()).result()
    self._bits, self._leaves, self.version = bits, leaves, version
    self._since_full = 0 if is_full else self._since_full + 1
    if is_full:
      self._collect_garbage(version)
    return manifest

  def _write_arrays(self, version: int, writes: dict[str, np.ndarray]) -> None:
    pending = []
    for path, data in writes.items():
      spec = _zarr_spec(self._store, version, path)
      spec.update(create=True, metadata={
          "shape": list(data.shape), "data_type": data.dtype.name,
          "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": _chunk_shape(
              data.shape, data.dtype.itemsize, self._chunk_bytes)}},
          "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                     {"name": "blosc", "configuration": {
                         "cname": "zstd", "clevel": self._zstd_level, "shuffle": "shuffle",
                         "typesize": data.dtype.itemsize, "blocksize": 0}}]})
      pending.append((ts.open(spec), data))
    # Open and write every leaf at once so tensorstore compresses chunks in parallel.
    writes_done = [store.result().write(data) for store, data in pending]
    for done in writes_done:
      done.result()

  def _collect_garbage(self, full_version: int) -> None:
    """Deletes every version older than `full_version`: manifests first, so no reader
    starts on a chain whose arrays are about to go."""
    self._store.delete_range(ts.KvStore.KeyRange(
        "manifests/", _manifest_key(full_version))).result()
    self._store.delete_range(ts.KvStore.KeyRange(
        "arrays/", _arrays_key(full_version))).result()


def list_versions(store: ts.KvStore) -> list[int]:
  """Complete (manifest written) versions, ascending."""
  keys = store.list(ts.KvStore.KeyRange("manifests/", "manifests0")).result()
  found = (_MANIFEST_RE.fullmatch(k.decode()) for k in keys)
  return sorted(int(m.group(1)) for m in found if m)


class WeightSubscriber:
  """Rebuilds published trees; caches the last one so the next load reads only newer
  deltas. `version` is the last version loaded (None before the first)."""

  def __init__(self, directory):
    self.directory = directory
    self._store = open_store(directory)
    self._bits: dict[str, np.ndarray] = {}
    self._leaves: dict[str, dict] = {}
    self._snapshot_id = ""
    self.version: int | None = None

  def latest_version(self) -> int | None:
    """The newest complete version (half-written ones have no manifest), or None."""
    versions = list_versions(self._store)
    return versions[-1] if versions else None

  def poll(self, like=None):
    """(params, version) of the newest version if newer than the last loaded, else None."""
    latest = self.latest_version()
    while latest is not None and (self.version is None or latest > self.version):
      try:
        return self.load(latest, like=like), latest
      except WeightSyncError:
        # A full snapshot published meanwhile may have garbage-collected our chain; if
        # so, move on to it, otherwise the error is real.
        newer = self.latest_version()
        if newer is None or newer <= latest:
          raise
        latest = newer
    return None

  def load(self, version: int | None = None, like=None):
    """The tree of `version` (default: the newest).

    Without `like`: nested dicts of read-only numpy arrays (copy before mutating). With
    `like` (a tree of arrays or jax.ShapeDtypeStructs with the published paths, shapes,
    dtypes): that tree's structure, each leaf placed on its `sharding` when it has one.
    """
    if version is None:
      version = self.latest_version()
      if version is None:
        raise WeightSyncError(f"No complete weights version in {self.directory} yet; "
                              "wait for the publisher's first publish (or poll()).")
    version = _check_version(version)
    target = self._manifest(version, wanted=version)
    # The cached tree is a valid start only within the same chain (a publisher restarted
    # in a wiped directory may reuse version numbers).
    resume = (self.version is not None and self.version <= version
              and target["snapshot_id"] == self._snapshot_id)
    chain = [] if resume and version == self.version else [target]
    while chain and chain[-1]["kind"] != "full" and not (
        resume and chain[-1]["base"] == self.version):
      chain.append(self._manifest(chain[-1]["base"], wanted=version))
    from_full = bool(chain) and chain[-1]["kind"] == "full"
    bits, leaves = ({}, {}) if from_full else (dict(self._bits), self._leaves)
    for manifest in reversed(chain):
      leaves = self._apply(manifest, bits, leaves)
    self._bits, self._leaves, self.version = bits, leaves, version
    self._snapshot_id = target["snapshot_id"]
    arrays = {p: b.view(jnp.dtype(leaves[p]["dtype"])) for p, b in bits.items()}
    return unflatten(arrays) if like is None else _like(arrays, like, version)

  def _manifest(self, version: int, wanted: int) -> dict:
    result = self._store.read(_manifest_key(version)).result()
    if result.state != "value":
      raise WeightSyncError(
          f"Weights version {version} (needed to rebuild {wanted}) has no manifest in "
          f"{self.directory}: it was never completed or was garbage-collected after a "
          "newer full snapshot. Load latest_version() instead.")
    manifest = json.loads(result.value)
    if manifest.get("format") != FORMAT:
      raise WeightSyncError(f"{self.directory}/{_manifest_key(version)} has format "
                            f"{manifest.get('format')!r}, expected {FORMAT!r}; it was "
                            "written by another tool or c2jax version.")
    return manifest

  def _apply(self, manifest: dict, bits: dict, base_leaves: dict) -> dict:
    """Applies one version to `bits` in place (new arrays, never mutating old ones)."""
    version, leaves = manifest["version"], manifest["leaves"]
    if manifest["kind"] == "delta" and _structure(leaves) != _structure(base_leaves):
      raise WeightSyncError(
          f"Weights version {version} changes the tree of its base {manifest['base']}: "
          f"{_describe_mismatch(_structure(base_leaves), _structure(leaves))}. The "
          "publisher must write a changed model to a new directory.")
    opened = {p: ts.open({**_zarr_spec(self._store, version, p), "open": True})
              for p, m in leaves.items() if m["encoding"] != "unchanged"}
    reads = {p: self._guard(version, p, f.result).read() for p, f in opened.items()}
    for path, read in reads.items():
      data = self._guard(version, path, read.result)
      entry = leaves[path]
      if data.shape != tuple(entry["shape"]) or data.dtype.itemsize != jnp.dtype(
          entry["dtype"]).itemsize:
        raise self._leaf_error(version, path, f"stored {data.dtype}{list(data.shape)} "
                               f"does not match the manifest's {entry['dtype']}{entry['shape']}")
      new = data if entry["encoding"] == "raw" else np.asarray(  # 0-d stays an array
          np.bitwise_xor(bits[path], data))
      if _crc(new) != entry["crc32"]:
        raise self._leaf_error(version, path, "its rebuilt bits fail the manifest's "
                               "checksum (a chunk file is missing or corrupt)")
      new.flags.writeable = False
      bits[path] = new
    return leaves

  def _leaf_error(self, version: int, path: str, reason: str) -> WeightSyncError:
    return WeightSyncError(
        f"Weights version {version}, leaf {path!r} in {self.directory}: {reason}. The "
        "manifest says this array was written, so it is missing or corrupt: have the "
        "publisher write a full snapshot (publish(..., full=True)) and load that version.")

  def _guard(self, version: int, path: str, fn):
    try:
      return fn()
    except Exception as e:  # tensorstore reports I/O and decode errors as several types
      raise self._leaf_error(version, path, f"unreadable ({e})") from e


def _like(arrays: dict[str, np.ndarray], like, version: int):
  """`arrays` in the structure of `like`, checked leaf by leaf."""
  like_flat = flatten(like)
  if like_flat.keys() != arrays.keys():
    raise ValueError(f"like= does not match weights version {version}: "
                     f"{_describe_mismatch(dict.fromkeys(arrays), dict.fromkeys(like_flat))}.")
  leaves = []
  for path, target in like_flat.items():
    value = arrays[path]
    if tuple(target.shape) != value.shape or jnp.dtype(target.dtype) != value.dtype:
      raise ValueError(f"like= leaf {path!r} is {jnp.dtype(target.dtype)}"
                       f"{list(target.shape)} but version {version} has {value.dtype}"
                       f"{list(value.shape)}.")
    sharding = getattr(target, "sharding", None)
    leaves.append(value if isinstance(target, np.ndarray) else jax.device_put(value, sharding))
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)
