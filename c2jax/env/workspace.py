"""Host-side workspaces: a writable view over a read-only repository snapshot.

A `Snapshot` is a stack of read-only layer folders (top first). A `Workspace` is one
writable view of a snapshot, made in one of two ways:
  overlay: kernel overlayfs, true copy-on-write (needs the right to mount, e.g. root);
  copy:    a plain recursive copy (reflinks where the file system has them).
`strategy='auto'` takes overlay when this process can mount one, else copy.

Disk quota (`disk_mb`): where this process may mount (root), what a workspace can write
lives on its own ext4 file system of that size, in a sparse image file loop-mounted in
the family folder: overlay's upper and work folders, or (copy) the copy itself, whose
file system is made larger by the repository's size. Writes past the quota fail with
ENOSPC, and the host's disk gives the workspace at most the quota (the image file holds
only what was written; it is deleted with the workspace). Without the right to mount,
`quota_enforced` is False and nothing bounds the workspace's total size.

Snapshots of a live workspace freeze only what changed (overlay: the upper layer joins
the stack) or the whole tree (copy). Layer folders live in a `Family` folder shared by a
workspace and its forks, removed when the last member closes, at exit, or (if the process
was killed) by the next c2jax process that makes one (c2jax/env/scratch.py).
"""

import atexit
import dataclasses
import functools
import os
import shutil
import subprocess
import tempfile
import threading

from c2jax.env import sandbox_base as sandbox_lib
from c2jax.env import scratch


@dataclasses.dataclass(frozen=True)
class Snapshot:
  layers: tuple[str, ...]  # top first; the last one may be the user's own repo folder


_LIVE_MOUNTS: set[str] = set()
_LIVE_FAMILIES: set[str] = set()


class Family:
  """Owns the scratch folder of one workspace and its forks; refcounted."""

  def __init__(self):
    self.root = scratch.make('c2jax-ws-')
    _LIVE_FAMILIES.add(self.root)
    self._users = 0
    self._lock = threading.Lock()

  def new_dir(self, prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix, dir=self.root)

  def acquire(self) -> None:
    with self._lock:
      self._users += 1

  def release(self) -> None:
    with self._lock:
      self._users -= 1
      last = self._users == 0
    if last:
      shutil.rmtree(self.root, ignore_errors=True)
      _LIVE_FAMILIES.discard(self.root)


def _copy_tree(src: str, dst: str) -> None:
  # `cp -a` keeps modes, symlinks (unfollowed) and overlay whiteouts, and reflinks
  # where it can; shutil.copytree would follow nothing but also drop device nodes.
  subprocess.run(['cp', '-a', '--reflink=auto', '--no-target-directory', src, dst],
                 check=True, capture_output=True)


def _mount_overlay(layers, upper, work, merged) -> None:
  options = f'lowerdir={":".join(layers)},upperdir={upper},workdir={work}'
  subprocess.run(['mount', '-t', 'overlay', 'overlay', '-o', options, merged],
                 check=True, capture_output=True)


def _umount(path: str) -> None:
  subprocess.run(['umount', '-l', path], check=False, capture_output=True)
  _LIVE_MOUNTS.discard(path)


@atexit.register
def _clean_up_at_exit():
  # Sandboxes a program forgot to close must not leave mounts or folders on the host.
  for path in list(_LIVE_MOUNTS):
    _umount(path)
  for root in list(_LIVE_FAMILIES):
    shutil.rmtree(root, ignore_errors=True)


def _make_volume(image: str, mount_point: str, size_bytes: int) -> None:
  """A fresh ext4 file system of size_bytes in the sparse file `image`, mounted."""
  with open(image, 'wb') as f:
    f.truncate(size_bytes)
  # No journal and no blocks reserved for root: scratch space, all of it the sandbox's;
  # a new sparse file has nothing to discard, and its inode tables start out zero.
  subprocess.run(['mkfs.ext4', '-q', '-F', '-m', '0', '-O', '^has_journal',
                  '-E', 'nodiscard,lazy_itable_init=1', image], check=True,
                 capture_output=True)
  subprocess.run(['mount', '-o', 'loop,nosuid,nodev', image, mount_point], check=True,
                 capture_output=True)
  _LIVE_MOUNTS.add(mount_point)


@functools.cache
def quota_supported() -> bool:
  """Whether this process can loop-mount a file system (root, loop devices, mkfs.ext4)."""
  family = Family()
  family.acquire()
  try:
    volume = family.new_dir('disk-')
    _make_volume(volume + '.img', volume, 8 << 20)
    _umount(volume)
    return True
  except (subprocess.CalledProcessError, OSError):
    return False
  finally:
    family.release()


def _tree_bytes(folder: str) -> int:
  """Bytes the files under `folder` occupy (allocated blocks, as a copy would need)."""
  total = 0
  for dirpath, dirnames, filenames in os.walk(folder):
    for name in dirnames + filenames:
      total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
  return total


@functools.cache
def overlay_supported() -> bool:
  family = Family()
  family.acquire()
  try:
    lower, upper, work, merged = (family.new_dir(p) for p in ('l', 'u', 'w', 'm'))
    _mount_overlay([lower], upper, work, merged)
    _umount(merged)
    return True
  except (subprocess.CalledProcessError, FileNotFoundError):
    return False
  finally:
    family.release()


class Workspace:
  """A writable view of a snapshot at `self.root`."""

  def __init__(self, snapshot: Snapshot, strategy: str = 'auto',
               family: Family | None = None, disk_mb: int | None = None):
    if strategy == 'auto':
      # overlayfs option syntax cannot carry ':' or ',' in a layer path.
      plain = not any(c in layer for layer in snapshot.layers for c in ':,')
      strategy = 'overlay' if plain and overlay_supported() else 'copy'
    if strategy not in ('overlay', 'copy'):
      raise ValueError(f"Unknown workspace strategy {strategy!r}; use 'auto', "
                       "'overlay' or 'copy'.")
    if strategy == 'copy' and len(snapshot.layers) != 1:
      raise ValueError('A copy workspace needs a single-layer snapshot; this one has '
                       f'{len(snapshot.layers)} layers (made by an overlay workspace).')
    for layer in snapshot.layers:
      if not os.path.isdir(layer):
        raise FileNotFoundError(f'Repository snapshot folder {layer!r} does not exist.')
    self.strategy = strategy
    self.base = snapshot
    self.disk_mb = disk_mb
    self.quota_enforced = bool(disk_mb) and quota_supported()
    self.family = family or Family()
    self.family.acquire()
    self._closed = False
    self._volume = None
    try:
      self._materialize()
    except BaseException:
      self._discard()
      self.family.release()
      raise

  def _scratch_dir(self, prefix: str) -> str:
    """A new folder for what the workspace writes: on its quota volume where it has one."""
    if self._volume is None:
      return self.family.new_dir(prefix)
    return tempfile.mkdtemp(prefix=prefix, dir=self._volume)

  def _materialize(self) -> None:
    if self.quota_enforced:
      size = self.disk_mb << 20
      if self.strategy == 'copy':  # the copy's own files are not the sandbox's writes
        size += _tree_bytes(self.base.layers[0])
      self._volume = self.family.new_dir('disk-')
      _make_volume(self._volume + '.img', self._volume, size)
    if self.strategy == 'overlay':
      self._upper = self._scratch_dir('upper-')
      self._work = self._scratch_dir('work-')
      self.root = self.family.new_dir('merged-')
      _mount_overlay(self.base.layers, self._upper, self._work, self.root)
      _LIVE_MOUNTS.add(self.root)
    else:
      self.root = os.path.join(self._scratch_dir('copy-'), 'ws')
      _copy_tree(self.base.layers[0], self.root)

  def _discard(self) -> None:
    root = getattr(self, 'root', None)
    if self.strategy == 'overlay' and root is not None:
      _umount(root)
      shutil.rmtree(root, ignore_errors=True)
    if self._volume is not None:  # what was written goes with the volume's image file
      _umount(self._volume)
      shutil.rmtree(self._volume, ignore_errors=True)
      if os.path.exists(self._volume + '.img'):
        os.remove(self._volume + '.img')
      self._volume = None
    elif self.strategy == 'overlay':
      for path in (getattr(self, '_upper', None), getattr(self, '_work', None)):
        if path is not None:
          shutil.rmtree(path, ignore_errors=True)
    elif root is not None:
      shutil.rmtree(os.path.dirname(root), ignore_errors=True)
    self.root = self._upper = self._work = None

  def snapshot(self) -> Snapshot:
    frozen = os.path.join(self.family.new_dir('layer-'), 'l')
    if self.strategy == 'overlay':
      _copy_tree(self._upper, frozen)
      return Snapshot((frozen,) + self.base.layers)
    _copy_tree(self.root, frozen)
    return Snapshot((frozen,))

  def reset(self) -> None:
    self._discard()
    self._materialize()

  def close(self) -> None:
    if not self._closed:
      self._closed = True
      self._discard()
      self.family.release()

  # -- safe host-side file access -------------------------------------------------

  def resolve(self, path: str, must_exist: bool = False) -> str:
    """Host path of a workspace path; symlinks may not point outside the workspace."""
    rel = sandbox_lib.normalize_relpath(path)
    real = os.path.realpath(os.path.join(self.root, rel))
    root = os.path.realpath(self.root)
    if real != root and not real.startswith(root + os.sep):
      raise sandbox_lib.PathOutsideWorkspaceError(
          f'Path {path!r} resolves outside the workspace (through a symlink); '
          'only files inside the workspace can be used.')
    if must_exist and not os.path.lexists(real):
      raise FileNotFoundError(f'No such file in the workspace: {rel}')
    return real

  def read_file(self, path: str) -> bytes:
    real = self.resolve(path, must_exist=True)
    if os.path.isdir(real):
      raise IsADirectoryError(f'{path!r} is a directory; use list_dir to see it.')
    with open(real, 'rb') as f:
      return f.read()

  def write_file(self, path: str, data: bytes) -> None:
    real = self.resolve(path)
    if os.path.isdir(real):
      raise IsADirectoryError(f'{path!r} is a directory and cannot be written as a file.')
    os.makedirs(os.path.dirname(real), exist_ok=True)
    # Re-resolve the parent: a folder made just now cannot be a symlink, an old one might.
    self.resolve(os.path.relpath(os.path.dirname(real), os.path.realpath(self.root)))
    with open(real, 'wb') as f:
      f.write(data)

  def list_files(self) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(self.root):
      dirnames.sort()
      for name in filenames:
        full = os.path.join(dirpath, name)
        if os.path.isfile(full) and not os.path.islink(full):
          found.append(os.path.relpath(full, self.root))
    return sorted(found)
