"""What the package sources share: the Package record, FetchError, host commands, and
git commits with a fixed author and date (c2jax/env/packages/__init__.py says why)."""

from __future__ import annotations

import dataclasses
import os
import subprocess

DEFAULT_CACHE = os.path.expanduser('~/.cache/c2jax/packages')
REGISTRIES = ('npm', 'deb', 'pypi')
_DATE = '2000-01-01T00:00:00+00:00'
_GIT_ENV = {'GIT_AUTHOR_NAME': 'c2jax', 'GIT_AUTHOR_EMAIL': 'tasks@c2jax.invalid',
            'GIT_COMMITTER_NAME': 'c2jax', 'GIT_COMMITTER_EMAIL': 'tasks@c2jax.invalid',
            'GIT_AUTHOR_DATE': _DATE, 'GIT_COMMITTER_DATE': _DATE}


class FetchError(RuntimeError):
  """A package could not be fetched or made into a repository; the message says why."""


@dataclasses.dataclass(frozen=True)
class Package:
  spec: str          # exact: 'npm:minimist@1.2.8', 'deb:librust-itoa-dev=1.0.1-2'
  name: str          # for instance ids and records' `repo`: 'minimist@1.2.8'
  path: str          # the git repository (npm, deb) or the sdist file (pypi)
  base_commit: str   # the repository's HEAD; '' for an sdist
  steps: tuple[str, ...] = ()  # what fetching did (commands, dependencies, drops)

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def run(command: list[str], cwd: str, timeout_s: float, what: str) -> str:
  """A host command's stdout; FetchError with its output's end when it fails."""
  try:
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s, check=False,
                          env={**os.environ, **_GIT_ENV, 'LC_ALL': 'C'})
  except FileNotFoundError as e:
    raise FileNotFoundError(f'{command[0]} is not installed; it is needed to {what}.') from e
  except subprocess.TimeoutExpired as e:
    raise FetchError(f'`{" ".join(command)}` took over {timeout_s:.0f} s ({what}); '
                     'check the network or raise --timeout_s.') from e
  if proc.returncode != 0:
    raise FetchError(f'`{" ".join(command)}` failed (exit {proc.returncode}) while trying '
                     f'to {what}:\n{(proc.stdout + proc.stderr)[-2000:].strip()}')
  return proc.stdout


def commit_all(repo: str, message: str, timeout_s: float = 300.0) -> str:
  """Commits every file of `repo` (ignore files ignored: a package is what it ships)
  with the fixed author and date; returns the new HEAD."""
  if not os.path.isdir(os.path.join(repo, '.git')):
    run(['git', 'init', '-q', '-b', 'main', '.'], repo, timeout_s, 'make a git repository')
  run(['git', 'add', '-A', '-f', '.'], repo, timeout_s, 'add the package files to git')
  run(['git', '-c', 'commit.gpgsign=false', '-c', 'core.autocrlf=false', 'commit', '-q',
       '--no-verify', '--allow-empty', '-m', message], repo, timeout_s, 'commit the package')
  return run(['git', 'rev-parse', 'HEAD'], repo, timeout_s, 'read the commit').strip()
