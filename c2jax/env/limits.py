"""Resource limits shared by every sandbox backend."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one sandbox may consume.

  timeout_s: default wall-clock limit of one command (a call may pass its own).
  memory_mb: total memory of all processes of one command.
  max_processes: processes (and threads) alive at once; stops fork bombs.
  cpus: CPU time a command may use per second of wall time, in cores (a CFS bandwidth
    quota: bubblewrap's cgroup where cgroups are writable, docker's NanoCpus); a busy
    command is throttled, not killed.
  max_output_bytes: output a command may produce before it is killed; the result keeps
    the head and the tail of it.
  max_file_mb: largest file a process may write (RLIMIT_FSIZE).
  disk_mb: what a sandbox may write in all, over the files it started with (its
    workspace changes, and /tmp); writes past it fail inside with ENOSPC (bubblewrap) or
    EDQUOT (docker), and the host's disk keeps its space. bubblewrap enforces it where it
    may mount (root): the workspace's writable layer is a file system of this size in a
    sparse image file; elsewhere only /tmp is bounded and a warning says so. docker
    enforces it where the engine's storage can (see docker_backend.py).
  """
  timeout_s: float = 60.0
  memory_mb: int = 1024
  max_processes: int = 128
  cpus: float = 1.0
  max_output_bytes: int = 4 * 1024 * 1024
  max_file_mb: int = 256
  disk_mb: int = 1024

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(
            f'Sandbox limit {field.name}={value!r} must be a positive number; '
            f'pass e.g. {field.name}={field.default}.')

  @classmethod
  def from_kwargs(cls, **limits) -> 'Limits':
    """Builds limits from keyword arguments, naming any unknown key."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(limits) - known)
    if unknown:
      raise TypeError(
          f'Unknown sandbox limit(s) {unknown}; known limits are {sorted(known)}.')
    return cls(**limits)
