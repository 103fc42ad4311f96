"""Per-command control groups: a hard cap on total memory and process count.

rlimits alone cannot bound a sandbox: RLIMIT_AS is per process and RLIMIT_NPROC is not
enforced for root. Where the cgroup file system is writable (root, or a delegated
subtree) each command gets its own group; `CgroupSet.available()` says whether it is.
Both cgroup v1 (one hierarchy per controller) and v2 (unified) are handled.
"""

import functools
import os
import signal
import time
import uuid

_ROOT = '/sys/fs/cgroup'
_PREFIX = 'c2jax-sandbox'


def _write(path: str, value: str) -> None:
  with open(path, 'w') as f:
    f.write(value)


def _is_v2() -> bool:
  return os.path.exists(os.path.join(_ROOT, 'cgroup.controllers'))


class CgroupSet:
  """The group(s) of one command: memory and pids limits, join, kill-all, remove."""

  def __init__(self, memory_bytes: int, max_processes: int):
    name = f'{_PREFIX}-{uuid.uuid4().hex[:12]}'
    self.dirs: list[str] = []
    if _is_v2():
      parent = os.path.join(_ROOT, _PREFIX)
      os.makedirs(parent, exist_ok=True)
      # Controllers must be enabled on the parent before children can use them.
      _write(os.path.join(parent, 'cgroup.subtree_control'), '+memory +pids')
      path = os.path.join(parent, name)
      os.mkdir(path)
      self.dirs.append(path)
      _write(os.path.join(path, 'memory.max'), str(memory_bytes))
      _write(os.path.join(path, 'memory.swap.max'), '0')
      _write(os.path.join(path, 'pids.max'), str(max_processes))
    else:
      mem = os.path.join(_ROOT, 'memory', name)
      pids = os.path.join(_ROOT, 'pids', name)
      os.mkdir(mem)
      self.dirs.append(mem)
      os.mkdir(pids)
      self.dirs.append(pids)
      _write(os.path.join(mem, 'memory.limit_in_bytes'), str(memory_bytes))
      _write(os.path.join(pids, 'pids.max'), str(max_processes))

  @staticmethod
  @functools.cache
  def available() -> bool:
    """Whether this process may create groups with memory and pids limits (probed once)."""
    try:
      probe = CgroupSet(64 << 20, 8)
    except OSError:
      return False
    probe.remove()
    return True

  def procs_files(self) -> list[str]:
    """Files a process writes its pid to, to join the group(s)."""
    return [os.path.join(path, 'cgroup.procs') for path in self.dirs]

  def pids(self) -> list[int]:
    found = set()
    for path in self.dirs:
      try:
        with open(os.path.join(path, 'cgroup.procs')) as f:
          found.update(int(line) for line in f if line.strip())
      except FileNotFoundError:
        pass
    return sorted(found)

  def kill_all(self) -> None:
    """SIGKILLs every member until none is left (members may be forking)."""
    deadline = time.monotonic() + 5.0
    while (members := self.pids()) and time.monotonic() < deadline:
      for pid in members:
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
      time.sleep(0.01)

  def remove(self) -> None:
    self.kill_all()
    for path in self.dirs:
      for _ in range(100):
        try:
          os.rmdir(path)
          break
        except FileNotFoundError:
          break
        except OSError:  # Busy until the kernel has reaped the last member.
          time.sleep(0.01)
    self.dirs = []
