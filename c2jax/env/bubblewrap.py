"""The default sandbox backend: bubblewrap (Debian package `bubblewrap`).

Each command runs in fresh namespaces (user, pid, net, ipc, uts, mount, cgroup):
  * file system: the workspace read-write at /workspace; /usr (and the /bin, /lib
    links), a few files of /etc and the Python environment the tests need, read-only;
    nothing else of the host is visible; a private /tmp;
  * no network (a new, empty network namespace);
  * limits: wall time (killed at the deadline), memory, process count and CPU share (a
    cgroup per command when cgroups are writable, else RLIMIT_AS/RLIMIT_NPROC and no CPU
    bound), file size
    (RLIMIT_FSIZE), output (killed past Limits.max_output_bytes, head and tail kept),
    disk (Limits.disk_mb: the workspace's writable layer is a file system of that size
    where the launcher may mount, i.e. root, see workspace.py; /tmp is a tmpfs of that
    size, counted in the command's memory; past either, writes fail with ENOSPC);
  * when the command's first process exits, the pid namespace dies and takes every
    process it left behind with it; the cgroup is emptied as a second guard.
Processes do not live across `exec` calls: state lives in the workspace.

Nothing of the host's environment is readable inside (DESIGN: an actor's environment may
hold API keys). bubblewrap is launched with exactly the sandbox's environment
(`sandbox.command_environment`), never the caller's, and with `--as-pid-1` the command
itself is process 1: no bwrap process, whose environment and arguments would otherwise be
readable in /proc/1, is visible from inside. The mount options reach bwrap through a pipe
(`--args FD`), drained and closed before the command starts, so no command line names the
host paths behind the mounts; every other descriptor of the launcher is closed. What a
command can still learn of the host is the read-only mounts it needs, at their host paths
(/usr, the Python environments), and, in /proc/self/mountinfo, the host folder behind
/workspace.
"""

import fcntl
import functools
import os
import select
import shlex
import shutil
import subprocess
import sys
import time

from absl import logging

from c2jax.env import cgroups
from c2jax.env import limits as limits_lib
from c2jax.env import sandbox_base as sandbox_lib
from c2jax.env import workspace as workspace_lib

_ETC_FILES = ('/etc/ld.so.cache', '/etc/ld.so.conf', '/etc/localtime', '/etc/alternatives',
              '/etc/ssl/certs')
_SANDBOX_UID = 1000
_PATH = '/usr/local/bin:/usr/bin:/bin'
_warned_no_quota = False  # the warning that disk_mb cannot be enforced, once a process


def program(name: str, package: str) -> str:
  """Absolute path of a host program: commands are launched with the sandbox's PATH."""
  found = shutil.which(name)
  if found is None:
    raise RuntimeError(f'{name} is not installed: `apt-get install {package}`, '
                       "or use make_sandbox('docker', ...).")
  return found


def default_ro_binds() -> tuple[str, ...]:
  # The Python running c2jax is the one whose pytest the hidden tests use. The venv
  # comes first: its bin/ must come first on PATH.
  return tuple(dict.fromkeys((sys.prefix, sys.base_prefix)))


def venv_binds(venv: str) -> tuple[str, ...]:
  """The folders a virtual environment needs inside a sandbox: itself and the Python it
  was made from (pyvenv.cfg `home`), so an environment layer runs without the host's."""
  config = os.path.join(venv, 'pyvenv.cfg')
  if not os.path.isfile(config):
    raise FileNotFoundError(f'{venv} is not a virtual environment (no pyvenv.cfg); give '
                            'the layer directory `c2jax tasks install` printed.')
  with open(config) as f:
    fields = dict(line.split('=', 1) for line in f.read().splitlines() if '=' in line)
  home = {k.strip(): v.strip() for k, v in fields.items()}.get('home', '')
  if not home:
    raise ValueError(f'{config} names no base Python (`home = ...`); recreate the layer.')
  base = os.path.dirname(home)
  return tuple(dict.fromkeys((os.path.abspath(venv), base)))


def environment(ro_binds: tuple[str, ...]) -> dict[str, str]:
  """A command's whole environment: the environments' bin/ folders come first on PATH."""
  bins = [os.path.join(p, 'bin') for p in ro_binds]
  return sandbox_lib.command_environment(':'.join(bins + [_PATH]))


@functools.cache
def _tmpfs_size_supported() -> bool:
  """Whether this bubblewrap knows --size (0.5.0 and later)."""
  usage = subprocess.run([program('bwrap', 'bubblewrap'), '--help'], capture_output=True,
                         text=True, check=False)
  return '--size' in usage.stdout + usage.stderr


def bwrap_options(workspace_root: str, ro_binds: tuple[str, ...],
                  env: dict[str, str], rw_binds: tuple[str, ...] = (),
                  tmp_mb: int | None = None) -> list[str]:
  """bwrap's options for a command over `workspace_root` with environment `env`; /tmp
  holds at most tmp_mb where bubblewrap can size a tmpfs."""
  options = ['--unshare-all', '--unshare-user', '--uid', str(_SANDBOX_UID),
             '--gid', str(_SANDBOX_UID), '--die-with-parent', '--new-session',
             '--as-pid-1', '--cap-drop', 'ALL', '--hostname', 'sandbox', '--clearenv',
             '--ro-bind', '/usr', '/usr']
  for name in ('bin', 'lib', 'lib32', 'lib64', 'sbin'):
    path = '/' + name
    if os.path.islink(path):
      options += ['--symlink', os.readlink(path), path]
    elif os.path.isdir(path):
      options += ['--ro-bind', path, path]
  for path in _ETC_FILES:
    if os.path.exists(path):
      options += ['--ro-bind', path, path]
  # Mounts apply in order: the fresh /tmp comes first so that read-only binds of paths
  # under /tmp (e.g. a virtualenv in a CI checkout there) stay visible on top of it.
  options += ['--proc', '/proc', '--dev', '/dev']
  if tmp_mb and _tmpfs_size_supported():
    options += ['--size', str(tmp_mb << 20)]
  options += ['--tmpfs', '/tmp']
  for path in ro_binds:
    options += ['--ro-bind', path, path]
  for path in rw_binds:
    options += ['--bind', path, path]
  options += ['--bind', workspace_root, sandbox_lib.WORKDIR, '--chdir', sandbox_lib.WORKDIR]
  for name, value in env.items():
    options += ['--setenv', name, value]
  return options


def run_in_bwrap(options: list[str], argv: list[str], env: dict[str, str],
                 limits: limits_lib.Limits, timeout_s: float, stdin: bytes = b'',
                 use_cgroups: bool = True) -> sandbox_lib.ExecResult:
  """Runs argv inside bubblewrap configured by `options` (see the module docstring)."""
  data = b''.join(option.encode() + b'\0' for option in options)
  read_fd, write_fd = os.pipe()
  try:
    if len(data) > 1 << 16:  # a default pipe holds 64 KiB; the write below must not block
      fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, len(data))
    view = memoryview(data)
    while view:
      view = view[os.write(write_fd, view):]
    os.close(write_fd)
    write_fd = None
    argv = [program('bwrap', 'bubblewrap'), '--args', str(read_fd), '--'] + list(argv)
    return run_limited(argv, limits, timeout_s, env=env, stdin=stdin,
                       use_cgroups=use_cgroups, pass_fds=(read_fd,))
  finally:
    os.close(read_fd)
    if write_fd is not None:
      os.close(write_fd)


class _OutputKeeper:
  """Keeps the first and last `budget // 2` bytes of a stream; counts the rest."""

  def __init__(self, budget: int):
    self.half = max(budget // 2, 1)
    self.head = bytearray()
    self.tail = bytearray()
    self.total = 0

  def add(self, chunk: bytes) -> None:
    self.total += len(chunk)
    room = self.half - len(self.head)
    if room > 0:
      self.head += chunk[:room]
      chunk = chunk[room:]
    if chunk:
      self.tail += chunk
      del self.tail[:-self.half]

  def value(self) -> bytes:
    dropped = self.total - len(self.head) - len(self.tail)
    if dropped <= 0:
      return bytes(self.head + self.tail)
    marker = f'\n[... {dropped} bytes of output dropped ...]\n'.encode()
    return bytes(self.head) + marker + bytes(self.tail)


def limit_prefix(limits: limits_lib.Limits, group) -> list[str]:
  """Command prefix that joins the cgroup and sets rlimits, then execs the command.

  A shell and prlimit do this instead of a Popen preexec_fn: running Python in a forked
  child of a multithreaded process (JAX) can deadlock.
  """
  rlimits = [program('prlimit', 'util-linux'), f'--fsize={limits.max_file_mb << 20}', '--core=0']
  if group is None:  # weaker fallback: per-process memory, per-user process count
    rlimits += [f'--as={limits.memory_mb << 20}', f'--nproc={limits.max_processes}']
    return rlimits + ['--']
  files = ' '.join(shlex.quote(f) for f in group.procs_files())
  join = f'for f in {files}; do echo $$ > "$f" || exit 125; done; exec "$@"'
  return ['/bin/sh', '-c', join, 'sh'] + rlimits + ['--']


def _kill(proc, group) -> None:
  try:
    os.killpg(proc.pid, 9)
  except ProcessLookupError:
    pass
  if group is not None:
    group.kill_all()


def run_limited(argv: list[str], limits: limits_lib.Limits, timeout_s: float, *,
                env: dict[str, str], stdin: bytes = b'', use_cgroups: bool = True,
                pass_fds: tuple[int, ...] = ()) -> sandbox_lib.ExecResult:
  """Runs argv with wall-time, output, file-size and memory/process limits.

  The process gets exactly `env` and, besides stdin/stdout/stderr, only `pass_fds`.
  """
  group = None
  if use_cgroups:
    cpus = limits.cpus if cgroups.CgroupSet.cpu_available() else None
    group = cgroups.CgroupSet(limits.memory_mb << 20, limits.max_processes, cpus)
  argv = limit_prefix(limits, group) + list(argv)

  start = time.monotonic()
  keeper = _OutputKeeper(limits.max_output_bytes)
  timed_out = truncated = False
  try:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env=env, close_fds=True, pass_fds=pass_fds)
    try:
      proc.stdin.write(stdin)
      proc.stdin.close()
    except BrokenPipeError:
      pass
    fd = proc.stdout.fileno()
    deadline = start + timeout_s
    while True:
      left = deadline - time.monotonic()
      if left <= 0:
        timed_out = True
        break
      ready, _, _ = select.select([fd], [], [], left)
      if not ready:
        continue
      chunk = os.read(fd, 1 << 16)
      if not chunk:
        break
      keeper.add(chunk)
      if keeper.total > limits.max_output_bytes:
        truncated = True
        break
    if not (timed_out or truncated):
      try:  # output closed early does not mean the command is done
        proc.wait(timeout=max(deadline - time.monotonic(), 0))
      except subprocess.TimeoutExpired:
        timed_out = True
    if timed_out or truncated:
      _kill(proc, group)
    exit_code = proc.wait()
    proc.stdout.close()
  finally:
    if group is not None:
      group.remove()
  return sandbox_lib.ExecResult(exit_code=exit_code, output=keeper.value(),
                                timed_out=timed_out, truncated=truncated,
                                duration_s=time.monotonic() - start)


@sandbox_lib.register_backend('bubblewrap')
class BubblewrapSandbox(sandbox_lib.Sandbox):
  """A bubblewrap sandbox over a copy-on-write workspace of `repo`.

  Args:
    repo: host folder (a workspace Snapshot also works) the workspace starts from.
    ro_binds: extra host folders visible read-only at the same path; defaults to the
      running Python's environment so tests can run with its pytest.
    env_layer: a virtual environment made by `c2jax tasks install` (the repository's
      dependencies): bound read-only, with its base Python, instead of c2jax's own.
    rw_binds: host folders bound read-write at the same path (the installer's venv under
      construction and pip cache); first on PATH.
    workspace: 'auto' | 'overlay' | 'copy' (see workspace.py).
    **limits: fields of Limits.
  """

  def __init__(self, repo, ro_binds: tuple[str, ...] | None = None,
               workspace: str = 'auto', _family=None, env_layer: str = '',
               rw_binds: tuple[str, ...] = (), **limits):
    program('bwrap', 'bubblewrap')
    program('prlimit', 'util-linux')
    self.limits = limits_lib.Limits.from_kwargs(**limits)
    if env_layer and ro_binds is not None:
      raise ValueError('Give either env_layer (a venv from `c2jax tasks install`) or '
                       'ro_binds, not both.')
    self.env_layer = env_layer
    self.rw_binds = tuple(rw_binds)
    if env_layer:
      ro_binds = venv_binds(env_layer)
    self.ro_binds = default_ro_binds() if ro_binds is None else tuple(ro_binds)
    snapshot = repo if isinstance(repo, workspace_lib.Snapshot) else (
        workspace_lib.Snapshot((os.path.abspath(repo),)))
    self._strategy = workspace
    self._workspace = workspace_lib.Workspace(snapshot, workspace, _family,
                                              disk_mb=self.limits.disk_mb)
    self._use_cgroups = cgroups.CgroupSet.available()
    self._env = environment(self.rw_binds + self.ro_binds)
    self._set_options()
    global _warned_no_quota
    if not self.disk_quota_enforced and not _warned_no_quota:
      _warned_no_quota = True
      tmp = (f'/tmp ({self.limits.disk_mb} MB) and each file' if _tmpfs_size_supported()
             else 'each file (this bubblewrap is older than 0.5: /tmp has no --size)')
      logging.warning(
          'Sandbox disk quota not enforced on the workspace (disk_mb=%d): mounting its '
          'size-limited file system needs root (CAP_SYS_ADMIN), loop devices and '
          'mkfs.ext4. Only %s (max_file_mb=%d) are bounded.',
          self.limits.disk_mb, tmp, self.limits.max_file_mb)

  @property
  def disk_quota_enforced(self) -> bool:
    """Whether writes to the workspace past Limits.disk_mb fail (see workspace.py)."""
    return self._workspace.quota_enforced

  def _set_options(self) -> None:
    self._options = bwrap_options(self._workspace.root, self.ro_binds, self._env,
                                  self.rw_binds, tmp_mb=self.limits.disk_mb)

  @property
  def host_root(self) -> str:
    """The workspace as seen from the host (for tools that run host-side)."""
    return self._workspace.root

  def exec(self, argv, timeout_s=None, stdin=b''):
    if self._workspace is None:
      raise sandbox_lib.SandboxError('This sandbox is closed; start a new one with '
                                     'make_sandbox.')
    timeout = self.limits.timeout_s if timeout_s is None else timeout_s
    try:
      return run_in_bwrap(self._options, argv, self._env, self.limits, timeout, stdin,
                          self._use_cgroups)
    except OSError as e:  # bwrap could not be started (the host, not the command)
      raise sandbox_lib.SandboxError(f'bubblewrap could not run the command: {e}') from e

  def read_file(self, path):
    return self._workspace.read_file(path)

  def write_file(self, path, data):
    self._workspace.write_file(path, data)

  def list_files(self):
    return self._workspace.list_files()

  def snapshot(self):
    return self._workspace.snapshot()

  def fork(self):
    return BubblewrapSandbox(self.snapshot(), ro_binds=self.ro_binds,
                             rw_binds=self.rw_binds,
                             workspace=self._workspace.strategy,
                             _family=self._workspace.family,
                             **vars(self.limits))

  def reset(self):
    self._workspace.reset()
    self._set_options()  # the reset workspace is mounted at a new host path

  def close(self):
    if self._workspace is not None:
      self._workspace.close()
      self._workspace = None
