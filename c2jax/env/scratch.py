"""Scratch folders that a killed process leaves behind are cleaned up by the next one.

A process killed outright (SIGKILL from the OOM killer, `kill -9`, a lost Ray node, an
actor's parent-death signal) runs no cleanup: its sandboxes' overlay and loop mounts stay
mounted, holding loop devices, and their folders stay in the temp dir. A long RL or eval
campaign on one machine would pile them up until mounts fail.

So every scratch folder made here records its owner in `OWNER_FILE` (pid, the process's
start time, the boot id and the pid namespace), and the first folder a process makes sweeps
the temp dir: a `c2jax-*` folder whose owner is gone has whatever is mounted under it
lazily unmounted (deepest first; a loop device goes with its last mount) and is deleted. A
folder is never deleted while anything under it is still mounted (an unmount that was
refused, e.g. without root), nor when its owner may be alive: the same process, or one
in another pid namespace whose liveness cannot be read from here. Folders of the same
kinds made before owner files existed are judged by age (`LEGACY_GRACE_S`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time

OWNER_FILE = '.c2jax-owner'
# Kinds of scratch folder that predate owner files: a workspace family and an actor's
# fetched repositories. Anything else named c2jax-* without an owner file is left alone.
_LEGACY = re.compile(r'c2jax-(ws|actor\d+-repos)-')
LEGACY_GRACE_S = 600

_log = logging.getLogger(__name__)


def _read(path: str) -> str | None:
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return None


def _start_time(pid: int) -> str | None:
  """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
  stat = _read(f'/proc/{pid}/stat')
  if stat is None:
    return None
  # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
  return stat[stat.rindex(')') + 2:].split()[19]


def _pid_namespace() -> str | None:
  try:
    return os.readlink('/proc/self/ns/pid')
  except OSError:
    return None


def owner_record() -> dict:
  """What identifies this process across pid reuse and reboots."""
  boot = _read('/proc/sys/kernel/random/boot_id')
  return {'pid': os.getpid(), 'start': _start_time(os.getpid()),
          'boot': boot.strip() if boot else None, 'pidns': _pid_namespace()}


def owner_gone(record: dict, here: dict | None = None) -> bool:
  """Whether the process `record` names has certainly exited (`here`: this process's
  owner_record, if already read)."""
  here = here or owner_record()
  if record.get('boot') and here['boot'] and record['boot'] != here['boot']:
    return True  # made before this boot: nothing of it runs or is mounted any more
  if record.get('pidns') != here['pidns']:
    return False  # another container's process: its liveness is not visible from here
  if record.get('pid') == here['pid']:
    return False
  start = _start_time(int(record['pid']))
  if start is None:
    return True
  return record.get('start') is not None and start != record['start']  # pid reused


def make(prefix: str) -> str:
  """A new folder in the temp dir named `prefix` + random, owned by this process.

  The first call in a process sweeps the temp dir of what dead owners left (`sweep`).
  """
  if not prefix.startswith('c2jax-'):
    raise ValueError(f'Scratch folder prefixes start with "c2jax-"; got {prefix!r}.')
  _sweep_once()
  root = tempfile.mkdtemp(prefix=prefix)
  with open(os.path.join(root, OWNER_FILE), 'w') as f:
    json.dump(owner_record(), f)
  return root


def _unescape(field: str) -> str:
  return re.sub(r'\\([0-7]{3})', lambda m: chr(int(m.group(1), 8)), field)


def mounts_under(root: str) -> list[str]:
  """Mount points at or below `root` in this mount namespace, deepest first."""
  text = _read('/proc/self/mountinfo') or ''
  root = os.path.realpath(root)
  found = []
  for line in text.splitlines():
    fields = line.split(' ')
    if len(fields) > 4:
      point = _unescape(fields[4])
      if point == root or point.startswith(root + os.sep):
        found.append(point)
  return sorted(set(found), key=lambda p: p.count(os.sep), reverse=True)


def _stale(root: str, name: str, here: dict) -> bool:
  text = _read(os.path.join(root, OWNER_FILE))
  if text is None:
    if not _LEGACY.match(name):
      return False
    try:
      return time.time() - os.stat(root).st_mtime > LEGACY_GRACE_S
    except OSError:
      return False
  try:
    record = json.loads(text)
    int(record['pid'])
  except (ValueError, KeyError, TypeError):
    return False  # not a record this module wrote
  return owner_gone(record, here)


def remove(root: str) -> bool:
  """Unmounts what is mounted under `root` and deletes it; False (and nothing deleted)
  if a mount under it stays."""
  for point in mounts_under(root):
    subprocess.run(['umount', '-l', point], check=False, capture_output=True)
  left = mounts_under(root)
  if left:
    _log.warning('Left %s in place: %d mount(s) under it could not be unmounted '
                 '(first: %s); unmount them as root and delete it.', root, len(left),
                 left[0])
    return False
  shutil.rmtree(root, ignore_errors=True)
  return True


def sweep(tmpdir: str | None = None) -> list[str]:
  """Removes the c2jax scratch folders in `tmpdir` (default: the temp dir) whose owner
  process is gone; returns the folders removed."""
  tmpdir = tmpdir or tempfile.gettempdir()
  try:
    names = sorted(os.listdir(tmpdir))
  except OSError:
    return []
  removed, here = [], owner_record()
  for name in names:
    root = os.path.join(tmpdir, name)
    if name.startswith('c2jax-') and os.path.isdir(root) and not os.path.islink(root):
      if _stale(root, name, here) and remove(root):
        removed.append(root)
  if removed:
    _log.info('Removed %d scratch folder(s) left by processes that were killed.',
              len(removed))
  return removed


@functools.cache
def _sweep_once() -> None:
  try:
    sweep()
  except Exception as e:  # pylint: disable=broad-except  # cleanup must never fail a run
    _log.warning('Sweeping stale scratch folders failed: %s', e)
