"""Btrfs quota modes, for the docker backend's engine (tools/setup_docker.sh).

A docker engine on btrfs enforces a container's `--storage-opt size=` (the sandbox's
disk_mb) with a btrfs quota group on the container's subvolume. How the kernel counts
decides what the size bounds and what a container costs:

- full quota groups (`btrfs quota enable`): a subvolume's count is every byte it
  references, the files it shares with its image included, so the size must be the
  image's size plus disk_mb. Deleting a container makes the kernel account each extent of
  the image again (back-reference walks in btrfs-cleaner): measured here, 2.7-4.8 s wall
  per docker sandbox opened, used and closed, and about 5 s of kernel CPU each.
- simple quotas (kernel 6.7+): an extent counts against the subvolume that wrote it, so a
  container's count is what it wrote, and the size is disk_mb itself; deleting one walks
  nothing: 0.8-1.0 s per sandbox, 0.07 s of kernel CPU (docs/benchmarks.md, Sandboxes).

  python -m c2jax.env.btrfs mode DIR     # prints simple, full or off
  python -m c2jax.env.btrfs simple DIR   # as root: DIR's file system to simple quotas
"""

import errno
import fcntl
import os
import struct
import sys
import uuid

SYSFS = '/sys/fs/btrfs'
_MAGIC = 0x94


def _ioc(direction: int, number: int, size: int) -> int:
  return (direction << 30) | (size << 16) | (_MAGIC << 8) | number


# linux/btrfs.h: struct btrfs_ioctl_fs_info_args is 1024 bytes, the fsid at offset 16;
# struct btrfs_ioctl_quota_ctl_args is {__u64 cmd; __u64 status}.
_FS_INFO = _ioc(2, 31, 1024)  # _IOR
_QUOTA_CTL = _ioc(3, 40, 16)  # _IOWR
_QUOTA_DISABLE, _QUOTA_ENABLE_SIMPLE = 2, 4


def _ioctl(path: str, request: int, buf: bytearray) -> bytearray:
  fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
  try:
    fcntl.ioctl(fd, request, buf)
  finally:
    os.close(fd)
  return buf


def fs_uuid(path: str) -> str:
  """The UUID of the btrfs file system holding `path` (its /sys/fs/btrfs folder's name).
  OSError where `path` is not on btrfs (ENOTTY) or may not be opened."""
  try:
    buf = _ioctl(path, _FS_INFO, bytearray(1024))
  except OSError as e:
    if e.errno == errno.ENOTTY:
      raise OSError(e.errno, f'{path} is not on a btrfs file system') from e
    raise
  return str(uuid.UUID(bytes=bytes(buf[16:32])))


def quota_mode(path: str) -> str:
  """'simple', 'full' or 'off': how the btrfs file system holding `path` counts quota
  groups. OSError where `path` is not on btrfs or may not be opened."""
  qgroups = os.path.join(SYSFS, fs_uuid(path), 'qgroups')
  if not os.path.isdir(qgroups):
    return 'off'
  try:
    with open(os.path.join(qgroups, 'mode')) as f:
      mode = f.read().strip()
  except FileNotFoundError:
    return 'full'  # a kernel before 6.7: no mode file, and no simple quotas
  return 'simple' if mode == 'squota' else 'full'


def enable_simple_quotas(path: str) -> None:
  """Switches the btrfs file system holding `path` to simple quotas (root only). Full
  quota groups are turned off first: their counts are dropped, and from here on a
  subvolume counts what it writes. OSError naming the kernel's refusal (before 6.7 it has
  no simple quotas) or the missing privilege; the file system keeps no quotas then."""
  mode = quota_mode(path)
  if mode == 'simple':
    return
  if mode == 'full':
    _ioctl(path, _QUOTA_CTL, bytearray(struct.pack('QQ', _QUOTA_DISABLE, 0)))
  try:
    _ioctl(path, _QUOTA_CTL, bytearray(struct.pack('QQ', _QUOTA_ENABLE_SIMPLE, 0)))
  except OSError as e:
    if e.errno == errno.EINVAL:
      raise OSError(e.errno, f'the kernel ({os.uname().release}) has no btrfs simple '
                    'quotas (Linux 6.7 or later has them); use `btrfs quota enable` for '
                    f'full quota groups on {path}') from e
    raise


def main(argv: list[str]) -> int:
  if len(argv) != 3 or argv[1] not in ('mode', 'simple'):
    print('usage: python -m c2jax.env.btrfs mode|simple DIR', file=sys.stderr)
    return 2
  try:
    if argv[1] == 'simple':
      enable_simple_quotas(argv[2])
    print(quota_mode(argv[2]))
  except OSError as e:
    print(f'{argv[2]}: {e}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
