"""The `Sandbox` interface every backend implements, and the registry backends join.

A sandbox is an isolated copy of a repository (the workspace, mounted at `WORKDIR`
inside) in which commands run with no network and bounded time, memory, processes and
output. File access from the host goes through `read_file`/`write_file`/`list_files`,
whose paths are relative to the workspace and may never leave it.

Backends (bubblewrap.py, docker_backend.py) import this module; sandbox.py, the public
face (make_sandbox, backends), imports them, so neither imports the other's importer.
"""

import abc
import dataclasses
import posixpath
from typing import Callable

from c2jax.env import limits as limits_lib

WORKDIR = '/workspace'

# The environment of every sandboxed command, on every backend; this is the one place it
# is defined. A command sees exactly these variables plus PATH (bubblewrap: the read-only
# Python environments' bin/ folders, then /usr/local/bin:/usr/bin:/bin; docker: the
# image's own ENV, which these override). Tasks set no variables. Nothing of the launching
# process's environment reaches a sandbox by any path: the actor that starts sandboxes may
# hold API keys and storage credentials, and any command the model writes runs in there.
BASE_ENVIRONMENT = {
    'HOME': '/tmp',
    'LANG': 'C.UTF-8',
    'PWD': WORKDIR,
    'PYTHONDONTWRITEBYTECODE': '1',
    'TMPDIR': '/tmp',
}


def command_environment(path: str) -> dict[str, str]:
  """The full environment of a sandboxed command whose PATH is `path`."""
  return {'PATH': path, **BASE_ENVIRONMENT}


class SandboxError(RuntimeError):
  """The sandbox itself failed (could not start, crashed, its container or workspace is
  gone): infrastructure, not the model. A command of the model's that fails or times out
  is an ExecResult, never this. Rollouts hit by it are retried on a fresh sandbox."""


class PathOutsideWorkspaceError(ValueError):
  """A path names something outside the workspace (absolute, `..`, or a symlink out)."""


@dataclasses.dataclass(frozen=True)
class ExecResult:
  """Outcome of one command. `output` interleaves stdout and stderr."""
  exit_code: int
  output: bytes
  timed_out: bool = False
  truncated: bool = False
  duration_s: float = 0.0

  @property
  def text(self) -> str:
    return self.output.decode('utf-8', errors='replace')


def normalize_relpath(path: str) -> str:
  """Returns `path` as a clean workspace-relative path or raises.

  Absolute paths are accepted only under WORKDIR, so a model may use either form.
  """
  if not isinstance(path, str) or not path or '\x00' in path:
    raise PathOutsideWorkspaceError(
        f'Path {path!r} is not a valid path; give a path relative to the workspace.')
  if path.startswith('/'):
    if path != WORKDIR and not path.startswith(WORKDIR + '/'):
      raise PathOutsideWorkspaceError(
          f'Path {path!r} is outside the workspace {WORKDIR}; use a relative path.')
    path = path[len(WORKDIR):].lstrip('/') or '.'
  clean = posixpath.normpath(path)
  if clean == '..' or clean.startswith('../'):
    raise PathOutsideWorkspaceError(
        f'Path {path!r} leaves the workspace; stay inside {WORKDIR}.')
  return clean


class Sandbox(abc.ABC):
  """One isolated workspace. Use as a context manager; `close` ends every process."""

  limits: limits_lib.Limits

  @abc.abstractmethod
  def exec(self, argv: list[str], timeout_s: float | None = None,
           stdin: bytes = b'') -> ExecResult:
    """Runs argv with cwd WORKDIR; every process it started is gone on return."""

  @abc.abstractmethod
  def read_file(self, path: str) -> bytes:
    """Bytes of a workspace file. Raises FileNotFoundError, IsADirectoryError or
    PathOutsideWorkspaceError."""

  @abc.abstractmethod
  def write_file(self, path: str, data: bytes) -> None:
    """Creates or replaces a workspace file, creating parent folders."""

  @abc.abstractmethod
  def list_files(self) -> list[str]:
    """Sorted workspace-relative paths of all regular files (symlinks not followed)."""

  @abc.abstractmethod
  def snapshot(self) -> object:
    """Freezes the current workspace; the handle can start new sandboxes (`fork`)."""

  @abc.abstractmethod
  def fork(self) -> 'Sandbox':
    """A new, independent sandbox whose workspace starts as this one is now."""

  @abc.abstractmethod
  def reset(self) -> None:
    """Puts the workspace back to the state it was created from."""

  @abc.abstractmethod
  def close(self) -> None:
    """Kills everything still running and frees the workspace. Idempotent."""

  def run_shell(self, command: str, timeout_s: float | None = None) -> ExecResult:
    return self.exec(['/bin/sh', '-c', command], timeout_s=timeout_s)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


SandboxFactory = Callable[..., Sandbox]
BACKENDS: dict[str, SandboxFactory] = {}


def register_backend(name: str):
  def wrap(factory):
    BACKENDS[name] = factory
    return factory
  return wrap
