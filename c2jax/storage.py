"""Where a run's large outputs live: a local path or an object-store URL, in one helper.

Checkpoints (orbax) and published weights (tensorstore) may go to a local directory or
to any URL those libraries can write (`gs://bucket/run`, `s3://bucket/run`,
`file:///abs/dir`). `pathlib.Path(x).absolute()` would turn `gs://b/run` into
`<cwd>/gs:/b/run`, so every config value naming such a location goes through
`resolve` (validated, local paths made absolute, URLs kept) and then through
`orbax_path` / `kvstore_spec` for the library that reads it. Readers of a finished run
(init_from, export, serve, eval) open it with `orbax_path` too: pathlib and etils.epath
paths share the methods they use (`/`, exists, is_dir, iterdir, read_text). What only
reads local files (HF safetensors directories) asks `require_local`, which turns a
remote URL into an error saying so.

  resolve('ckpt')                 -> '/cwd/ckpt'
  resolve('file:///data/run/')    -> 'file:///data/run'
  resolve('gs://bucket/run')      -> 'gs://bucket/run'
  join('gs://bucket/run', 'w', 3) -> 'gs://bucket/run/w/3'
"""

from __future__ import annotations

import os
import pathlib
import urllib.parse

# Schemes both orbax (etils.epath: file natively, gs/s3 through their filesystems) and
# tensorstore (kvstore drivers) can write.
SCHEMES = ("file", "gs", "s3")


class StorageLocationError(ValueError):
  """A location that is neither a local path nor a supported URL."""


def is_url(location) -> bool:
  """Whether `location` is spelled as a URL (`scheme://...`) rather than a local path."""
  return "://" in os.fspath(location)


def resolve(location, what: str = "location") -> str:
  """A canonical form of `location`: an absolute local path, or a validated URL without
  a trailing '/'. `what` names the config key in errors."""
  text = os.fspath(location)
  if not text:
    raise StorageLocationError(f"{what} is empty; give a local directory or a URL "
                               f"({', '.join(s + '://' for s in SCHEMES)}).")
  if not is_url(text):
    return str(pathlib.Path(text).expanduser().absolute())
  parsed = urllib.parse.urlsplit(text)
  if parsed.scheme not in SCHEMES:
    raise StorageLocationError(
        f"{what} = {text!r}: scheme {parsed.scheme!r}:// is not supported; use a local "
        f"path or one of {', '.join(s + '://' for s in SCHEMES)}.")
  if parsed.query or parsed.fragment:
    raise StorageLocationError(f"{what} = {text!r}: a storage URL takes no '?query' or "
                               "'#fragment'.")
  if parsed.scheme == "file":
    if parsed.netloc not in ("", "localhost"):
      raise StorageLocationError(
          f"{what} = {text!r}: a file URL names an absolute path, file:///abs/dir (three "
          f"slashes); {parsed.netloc!r} reads as a host name.")
    path = urllib.parse.unquote(parsed.path)
    if not path.startswith("/"):
      raise StorageLocationError(f"{what} = {text!r}: write file:///abs/dir.")
    return "file://" + os.path.normpath(path).rstrip("/") if path != "/" else "file:///"
  if not parsed.netloc:
    raise StorageLocationError(f"{what} = {text!r} names no bucket: write "
                               f"{parsed.scheme}://BUCKET/path.")
  path = parsed.path.rstrip("/")
  return f"{parsed.scheme}://{parsed.netloc}{path}"


def local_path(location, what: str = "location") -> pathlib.Path | None:
  """The local directory `location` names (a plain path or a file:// URL); None for a
  remote URL."""
  text = resolve(location, what)
  if not is_url(text):
    return pathlib.Path(text)
  if text.startswith("file://"):
    return pathlib.Path(text[len("file://"):])
  return None


def join(location, *parts) -> str:
  """`location` / parts, for local paths and URLs alike (parts use '/')."""
  base = resolve(location)
  tail = "/".join(str(p).strip("/") for p in parts if str(p).strip("/"))
  if not tail:
    return base
  return base + ("" if base.endswith("/") else "/") + tail


def orbax_path(location, what: str = "location"):
  """What orbax's CheckpointManager takes: a local pathlib.Path (also for file:// URLs)
  or an etils.epath.Path for an object store (gs:// needs gcsfs, s3:// needs s3fs).
  `what` names the config key or flag in errors."""
  local = local_path(location, what)
  if local is not None:
    return local
  from etils import epath  # pylint: disable=g-import-not-at-top

  return epath.Path(resolve(location, what))


def require_local(location, what: str, kind: str) -> pathlib.Path:
  """The local directory of `location` (a path or a file:// URL); a remote URL is an
  error naming `what` (the flag or key) and `kind` (what is read from local disk only)."""
  local = local_path(location, what)
  if local is None:
    raise StorageLocationError(
        f"{what} = {os.fspath(location)!r}: {kind} is read from local disk only; copy it "
        "to a local directory first (e.g. `gcloud storage cp -r` or `aws s3 cp "
        "--recursive`) and pass that path (or a file:// URL).")
  return local


def kvstore_spec(location) -> dict | str:
  """A tensorstore kvstore spec rooted at `location`, ending in '/' so keys appended to
  it land inside the directory."""
  local = local_path(location)
  if local is not None:
    return {"driver": "file", "path": str(local) + "/"}
  return resolve(location) + "/"


def remove_tree(location) -> None:
  """Deletes everything under `location` (a missing location is fine)."""
  local = local_path(location)
  if local is not None:
    import shutil  # pylint: disable=g-import-not-at-top

    shutil.rmtree(local, ignore_errors=True)
    return
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  ts.KvStore.open(kvstore_spec(location)).result().delete_range(ts.KvStore.KeyRange()).result()


def children(location) -> list[str]:
  """Names directly below `location` (files and folders; [] when it does not exist)."""
  local = local_path(location)
  if local is not None:
    return sorted(os.listdir(local)) if local.is_dir() else []
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  keys = ts.KvStore.open(kvstore_spec(location)).result().list().result()
  return sorted({key.decode().split("/", 1)[0] for key in keys})
