"""Btrfs quota modes (c2jax/env/btrfs.py) on a real btrfs: a loop-mounted image file of
this test's own, as root; and the docker engine's quota as the backend reads it."""

import contextlib
import errno
import os
import shutil
import subprocess

import pytest

from c2jax.env import btrfs
from c2jax.env import docker_backend
from c2jax.env import sandbox as sandbox_lib

MB = 1 << 20


@contextlib.contextmanager
def _mounted_btrfs(tmp_path):
  if os.getuid() != 0 or not shutil.which('mkfs.btrfs'):
    pytest.skip('needs root and mkfs.btrfs (btrfs-progs) to make and mount a btrfs')
  image, mountpoint = tmp_path / 'fs.img', tmp_path / 'mnt'
  mountpoint.mkdir()
  with open(image, 'wb') as f:
    f.truncate(512 * MB)  # sparse: the test writes about 100 MB of it
  subprocess.run(['mkfs.btrfs', '-q', str(image)], check=True, capture_output=True)
  mounted = subprocess.run(['mount', '-o', 'loop', str(image), str(mountpoint)],
                           capture_output=True, text=True)
  if mounted.returncode:
    pytest.skip(f'cannot mount a loop device here: {mounted.stderr.strip()}')
  try:
    yield str(mountpoint)
  finally:
    subprocess.run(['umount', str(mountpoint)], check=True)


def _btrfs(*args):
  subprocess.run(['btrfs', *args], check=True, capture_output=True)


def _write_until_full(folder, megabytes):
  """MB written in 4 MB files under `folder` before a write fails (at most `megabytes`)."""
  written = 0
  while written < megabytes:
    try:
      with open(os.path.join(folder, f'fill{written}'), 'wb') as f:
        f.write(b'\0' * (4 * MB))
        os.fsync(f.fileno())
    except OSError as e:
      assert e.errno in (errno.EDQUOT, errno.ENOSPC), e
      break
    written += 4
  return written


def test_simple_quotas_count_what_a_snapshot_writes_not_what_it_shares(tmp_path):
  with _mounted_btrfs(tmp_path) as root:
    assert btrfs.quota_mode(root) == 'off'
    _btrfs('quota', 'enable', root)
    assert btrfs.quota_mode(root) == 'full'
    try:
      btrfs.enable_simple_quotas(root)  # from full quota groups
    except OSError as e:
      pytest.skip(f'no simple quotas on this kernel: {e}')
    assert btrfs.quota_mode(root) == 'simple'
    btrfs.enable_simple_quotas(root)  # already simple: nothing to do
    # An image of 48 MB, and a container made from it as docker's btrfs driver makes
    # one: a snapshot with a size of 32 MB.
    image, container = os.path.join(root, 'image'), os.path.join(root, 'container')
    _btrfs('subvolume', 'create', image)
    with open(os.path.join(image, 'files'), 'wb') as f:
      f.write(os.urandom(48 * MB))
    _btrfs('subvolume', 'snapshot', image, container)
    _btrfs('qgroup', 'limit', '32M', container)
    # The image's files do not count: the container writes its 32 MB, and no more.
    assert 24 <= _write_until_full(container, 64) <= 32
    with open(os.path.join(container, 'files'), 'rb') as shared, \
         open(os.path.join(image, 'files'), 'rb') as original:
      assert shared.read() == original.read()  # the snapshot still holds the image's files


def test_a_folder_not_on_btrfs_is_named(tmp_path):
  with pytest.raises(OSError, match='not on a btrfs file system'):
    btrfs.quota_mode(str(tmp_path))
  assert btrfs.main(['btrfs', 'mode', str(tmp_path)]) == 1
  assert btrfs.main(['btrfs', 'nonsense']) == 2


def test_the_docker_engine_sizes_by_its_quota_mode(real_docker):
  """A sandbox's size on the real engine: disk_mb alone with simple quotas (the engine
  tools/setup_docker.sh starts, where the kernel has them), the image's size more with
  full quota groups (test_disk_quota.py checks what the size bounds)."""
  info = real_docker.info()
  if info['Driver'] != 'btrfs' or real_docker.api.base_url != docker_backend._LOCAL_ENGINE:
    pytest.skip(f'the engine is not a local one on btrfs ({info["Driver"]})')
  mode = btrfs.quota_mode(os.path.join(info['DockerRootDir'], 'btrfs'))
  image_mb = real_docker.images.get(docker_backend.sandbox_image()).attrs['Size'] >> 20
  with sandbox_lib.make_sandbox('docker', None, disk_mb=24) as box:
    size = box._container.attrs['HostConfig']['StorageOpt']['size']  # pylint: disable=protected-access
  assert size == ('24m' if mode == 'simple' else f'{image_mb + 24}m'), mode
