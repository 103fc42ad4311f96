"""Scratch folders of killed processes (c2jax/env/scratch.py): a SIGKILLed process's
workspace mounts and folders are removed by the next process; nothing a live process owns,
or that is not c2jax's, is touched."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from c2jax.env import scratch
from c2jax.env import workspace as workspace_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))

# A process that opens a workspace (overlay + a quota volume where it may mount), says
# where, and is killed before it can clean up.
_KILLED_CHILD = textwrap.dedent("""
    import os, signal, sys
    from c2jax.env import workspace
    ws = workspace.Workspace(workspace.Snapshot((sys.argv[1],)), disk_mb=int(sys.argv[2]) or None)
    with open(os.path.join(ws.root, 'written.txt'), 'w') as f:
      f.write('by the killed process')
    print(ws.family.root, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _write_owner(folder, **record):
  with open(os.path.join(folder, scratch.OWNER_FILE), 'w') as f:
    json.dump(record, f)


def test_a_killed_process_leaves_mounts_that_the_next_sweep_removes(tmp_path, repo):
  tmp = tmp_path / 'tmp'
  tmp.mkdir()
  mounting = workspace_lib.quota_supported()
  child = subprocess.run(
      [sys.executable, '-c', _KILLED_CHILD, str(repo), '8' if mounting else '0'],
      capture_output=True, text=True, timeout=120, check=False,
      env=dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=ROOT))
  assert child.returncode == -signal.SIGKILL, child.stderr
  left = child.stdout.strip()
  assert os.path.isdir(left) and os.path.dirname(left) == str(tmp)
  if mounting:  # the overlay and the loop-mounted quota volume outlived the process
    assert len(scratch.mounts_under(left)) == 2, scratch.mounts_under(left)
  # A live family beside it (this process's) and folders that are not c2jax's scratch.
  live = tmp / 'c2jax-ws-live'
  live.mkdir()
  _write_owner(live, **scratch.owner_record())
  cache = tmp / 'c2jax-test-xla-cache'  # no owner file, not a legacy kind: never touched
  cache.mkdir()
  os.utime(cache, (0, 0))

  assert scratch.sweep(str(tmp)) == [left]
  assert not os.path.exists(left) and scratch.mounts_under(left) == []
  assert live.is_dir() and cache.is_dir()
  # The snapshot under the overlay is the user's folder: untouched.
  assert os.path.isfile(os.path.join(repo, 'README.md'))


def test_whose_folders_count_as_gone(tmp_path):
  here = scratch.owner_record()
  assert not scratch.owner_gone(here)
  assert scratch.owner_gone(dict(here, boot='another-boot'))
  assert not scratch.owner_gone(dict(here, pid=1, pidns='pid:[1]'))  # another container
  done = subprocess.Popen([sys.executable, '-c', 'pass'])
  done.wait()
  assert scratch.owner_gone(dict(here, pid=done.pid, start='1'))
  parent = os.getppid()  # alive, but a reused pid starts at another time
  started = scratch._start_time(parent)  # pylint: disable=protected-access
  assert not scratch.owner_gone(dict(here, pid=parent, start=started))
  assert scratch.owner_gone(dict(here, pid=parent, start='0'))

  # Folders from before owner files: removed once older than the grace period.
  old, new = tmp_path / 'c2jax-ws-old', tmp_path / 'c2jax-actor3-repos-new'
  old.mkdir()
  new.mkdir()
  os.utime(old, (time.time() - scratch.LEGACY_GRACE_S - 60,) * 2)
  garbled = tmp_path / 'c2jax-ws-garbled'  # an owner file this module did not write
  garbled.mkdir()
  (garbled / scratch.OWNER_FILE).write_text('not json')
  assert scratch.sweep(str(tmp_path)) == [str(old)]
  assert new.is_dir() and garbled.is_dir()


def test_prefixes_are_c2jax_s():
  with pytest.raises(ValueError, match='c2jax-'):
    scratch.make('ws-')
