"""Per-command control groups: a hard cap on total memory, process count and CPU share.

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
_CPU_PERIOD_US = 100_000  # the quota below is per this period (the kernel's default)


def _write(path: str, value: str) -> None:
  with open(path, 'w') as f:
    f.write(value)


def _is_v2() -> bool:
  return os.path.exists(os.path.join(_ROOT, 'cgroup.controllers'))


class CgroupSet:
  """The group(s) of one command: memory, pids and CPU limits, join, kill-all, remove.

  `cpus`: CPU time per wall time (1.5 = one and a half cores), as a CFS bandwidth quota.
  """

  def __init__(self, memory_bytes: int, max_processes: int, cpus: float | None = None):
    name = f'{_PREFIX}-{uuid.uuid4().hex[:12]}'
    self.dirs: list[str] = []
    quota = None if cpus is None else max(1000, round(cpus * _CPU_PERIOD_US))
    try:
      if _is_v2():
        parent = os.path.join(_ROOT, _PREFIX)
        os.makedirs(parent, exist_ok=True)
        # Controllers must be enabled on the parent before children can use them.
        # Only what is used: a parent without the cpu controller (systemd user delegation
        # before v252, some containers) refuses the whole write when '+cpu' is in it.
        _write(os.path.join(parent, 'cgroup.subtree_control'),
               '+memory +pids' + (' +cpu' if quota is not None else ''))
        path = os.path.join(parent, name)
        os.mkdir(path)
        self.dirs.append(path)
        _write(os.path.join(path, 'memory.max'), str(memory_bytes))
        _write(os.path.join(path, 'memory.swap.max'), '0')
        _write(os.path.join(path, 'pids.max'), str(max_processes))
        if quota is not None:
          _write(os.path.join(path, 'cpu.max'), f'{quota} {_CPU_PERIOD_US}')
      else:
        for controller in ('memory', 'pids') + (('cpu',) if quota is not None else ()):
          os.mkdir(os.path.join(_ROOT, controller, name))
          self.dirs.append(os.path.join(_ROOT, controller, name))
        mem, pids = self.dirs[:2]
        _write(os.path.join(mem, 'memory.limit_in_bytes'), str(memory_bytes))
        _write(os.path.join(pids, 'pids.max'), str(max_processes))
        if quota is not None:
          _write(os.path.join(self.dirs[2], 'cpu.cfs_period_us'), str(_CPU_PERIOD_US))
          _write(os.path.join(self.dirs[2], 'cpu.cfs_quota_us'), str(quota))
    except OSError:
      self.remove()  # the groups made before the failure
      raise

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

  @staticmethod
  @functools.cache
  def cpu_available() -> bool:
    """Whether groups may also carry a CPU quota (the cpu controller; probed once)."""
    try:
      probe = CgroupSet(64 << 20, 8, cpus=1.0)
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
