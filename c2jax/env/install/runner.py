"""Auto-install: bring a repository (a folder or an sdist) to where its own tests run.

    result = install('path/to/repo' or 'pkg-1.0.tar.gz', InstallConfig())
    result.ok, result.layer, result.test_command, result.attempts

Loop: the proposer suggests a plan; a fresh venv (the future layer) is made on the host
from `config.python`; each command of the plan runs in a bubblewrap sandbox over a copy of
the repository with the venv and a shared pip cache bound read-write, the egress proxy's
folder read-only (the only way out: `config.allow_hosts`), and time/memory limits; then
the tests run in a sandbox starting from the venv as every rollout will (verify.py). The
first plan whose tests pass `config.pass_fraction` wins: its venv is the environment
layer (bound read-only by rollouts; no reinstall per rollout). Results live in
`config.cache_dir/<repository hash>/result.json`, so the same repository is installed once
(also a failure: `force=True` retries); a failure reports the last error and every
command tried.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

from c2jax.env import bubblewrap
from c2jax.env.install import egress, proposer as proposer_lib, verify

DEFAULT_CACHE = os.path.expanduser('~/.cache/c2jax/envs')
_SKIP_DIRS = {'.git', '__pycache__', '.tox', '.nox', '.venv', '.pytest_cache', '.mypy_cache'}
_CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt'
# Part of every cache key: bump when what a layer holds or how it is verified changes.
_CACHE_VERSION = 2


@dataclasses.dataclass(frozen=True)
class InstallConfig:
  """allow_hosts: the only hosts install commands reach (HTTPS CONNECT / HTTP, ports 80
  and 443). pass_fraction: share of collected tests that must pass. timeout_s /
  memory_mb / max_processes: limits of each install command and of the test run."""
  allow_hosts: tuple[str, ...] = ('pypi.org', 'files.pythonhosted.org')
  index_url: str = 'https://pypi.org/simple'
  proposer: str = 'heuristic'
  max_attempts: int = 4
  pass_fraction: float = 0.5
  timeout_s: float = 600.0
  memory_mb: int = 4096
  max_processes: int = 512
  cache_dir: str = DEFAULT_CACHE
  python: str = ''  # the base interpreter of layers; '' = the one running c2jax
  model_base_url: str = ''
  model_name: str = ''

  def __post_init__(self):
    if not 0.0 < self.pass_fraction <= 1.0:
      raise ValueError(f'pass_fraction={self.pass_fraction} must be in (0, 1]; e.g. 0.5 '
                       'accepts a repository when half its collected tests pass.')
    for name in ('max_attempts', 'timeout_s', 'memory_mb', 'max_processes'):
      if getattr(self, name) <= 0:
        raise ValueError(f'{name}={getattr(self, name)} must be positive.')
    if not self.allow_hosts:
      raise ValueError('allow_hosts is empty: installs could reach no package index; name '
                       'at least the index host (pypi.org, files.pythonhosted.org).')
    if self.proposer not in proposer_lib.proposer_names():
      raise ValueError(f'Unknown proposer {self.proposer!r}; choose one of '
                       f'{proposer_lib.proposer_names()}.')

  def base_python(self) -> str:
    return self.python or os.path.join(sys.base_prefix, 'bin', 'python3')


@dataclasses.dataclass
class InstallResult:
  ok: bool
  key: str
  repo: str                     # the source tree (an sdist is unpacked under the cache)
  layer: str                    # the venv every sandbox of this repository starts from
  test_command: str
  attempts: list[dict]
  verification: dict
  error: str
  duration_s: float
  cached: bool = False

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  def report(self) -> str:
    """The failure (or success) in words: the last error and every command tried."""
    lines = [f'{"installed" if self.ok else "FAILED to install"} {self.repo} '
             f'({len(self.attempts)} attempt(s), {self.duration_s:.1f}s)']
    for number, attempt in enumerate(self.attempts, 1):
      verdict = 'ok' if attempt['ok'] else 'failed' + (
          f' at `{attempt["failed_command"]}`' if attempt['failed_command'] else
          f' its tests {attempt["test_summary"]}')
      lines.append(f'  attempt {number} ({attempt["note"]}): {verdict}')
      lines += [f'    $ {c}' for c in attempt['commands']]
    if self.ok:
      lines.append(f'layer: {self.layer}\ntest command: {self.test_command}\n'
                   f'tests: {self.verification}')
    else:
      lines.append(f'last error:\n{self.error[-3000:]}')
    return '\n'.join(lines)


def tree_hash(repo: str) -> str:
  """Content hash of a source tree (paths and bytes; VCS and cache folders skipped)."""
  digest = hashlib.sha256()
  for dirpath, dirnames, filenames in os.walk(repo):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    for name in sorted(filenames):
      path = os.path.join(dirpath, name)
      if os.path.islink(path) or not os.path.isfile(path):
        continue
      digest.update(os.path.relpath(path, repo).encode() + b'\0')
      with open(path, 'rb') as f:
        digest.update(hashlib.sha256(f.read()).digest())
  return digest.hexdigest()


def _cache_key(source_hash: str, config: InstallConfig) -> str:
  python = os.path.realpath(config.base_python())
  settings = json.dumps([_CACHE_VERSION, source_hash, python, config.proposer, config.pass_fraction,
                         config.index_url, config.model_name], sort_keys=True)
  return hashlib.sha256(settings.encode()).hexdigest()[:20]


def _unpack_sdist(path: str, dest: str) -> str:
  if not tarfile.is_tarfile(path):
    raise ValueError(f'{path} is neither a folder nor a .tar.gz source distribution.')
  if not os.path.isdir(dest):
    tmp = dest + '.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(path) as tar:
      tar.extractall(tmp, filter='data')
    os.replace(tmp, dest)
  tops = os.listdir(dest)
  return os.path.join(dest, tops[0]) if len(tops) == 1 else dest


def test_files(repo: str) -> list[str]:
  """pytest-style test modules (test_*.py, *_test.py) in the tree."""
  found = []
  for dirpath, dirnames, filenames in os.walk(repo):
    dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
    found += [os.path.relpath(os.path.join(dirpath, n), repo) for n in filenames
              if n.endswith('.py') and (n.startswith('test_') or n.endswith('_test.py'))]
  return sorted(found)


def _make_venv(python: str, venv: str) -> None:
  shutil.rmtree(venv, ignore_errors=True)
  proc = subprocess.run([python, '-m', 'venv', venv], capture_output=True, text=True,
                        env={'PATH': os.environ.get('PATH', '/usr/bin:/bin')})
  if proc.returncode != 0:
    raise RuntimeError(f'Could not create a venv with {python}: {proc.stderr[-1000:]}; set '
                       'InstallConfig.python to an interpreter with the venv module.')


def _pip_environment(config: InstallConfig, pip_cache: str) -> str:
  values = {'PIP_INDEX_URL': config.index_url, 'PIP_CACHE_DIR': pip_cache,
            'PIP_DISABLE_PIP_VERSION_CHECK': '1', 'PIP_NO_INPUT': '1',
            'PIP_PROGRESS_BAR': 'off', 'PIP_ROOT_USER_ACTION': 'ignore'}
  if os.path.isfile(_CA_BUNDLE):  # the host's trust store (it may hold a proxy's CA)
    values.update(PIP_CERT=_CA_BUNDLE, SSL_CERT_FILE=_CA_BUNDLE)
  return 'export ' + ' '.join(f'{k}={v}' for k, v in values.items()) + '; '


def _run_plan(plan, repo, venv, pip_cache, proxy, config) -> tuple[str, str]:
  """Runs the plan's commands; ('', '') or (failed command, its output tail)."""
  with bubblewrap.BubblewrapSandbox(
      repo, ro_binds=bubblewrap.venv_binds(venv)[1:] + (proxy.folder,),
      rw_binds=(venv, pip_cache), timeout_s=config.timeout_s, memory_mb=config.memory_mb,
      max_processes=config.max_processes) as box:
    prefix = _pip_environment(config, pip_cache)
    for command in plan.commands:
      result = box.run_shell(proxy.wrap(prefix + command))
      if result.exit_code != 0 or result.timed_out:
        why = ' [timed out]' if result.timed_out else f' [exit {result.exit_code}]'
        refused = (f'\n[egress refused: {sorted(set(proxy.refused))}]'
                   if proxy.refused else '')
        return command, result.text[-4000:] + why + refused
  return '', ''


def install(source: str, config: InstallConfig = InstallConfig(),
            force: bool = False) -> InstallResult:
  """See the module docstring. `source` is a repository folder or an sdist (.tar.gz).
  Concurrent installs of one repository (e.g. several builders) wait for each other and
  then share the cached result."""
  started = time.monotonic()
  source = os.path.abspath(source)
  if not os.path.exists(source):
    raise FileNotFoundError(f'{source} does not exist; give a repository folder or an sdist.')
  if os.path.isdir(source):
    source_hash = tree_hash(source)
  else:
    with open(source, 'rb') as f:
      source_hash = hashlib.sha256(f.read()).hexdigest()
  key = _cache_key(source_hash, config)
  folder = os.path.join(os.path.expanduser(config.cache_dir), key)
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, 'lock'), 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    return _install_locked(source, folder, key, config, force, started)


def _install_locked(source, folder, key, config, force, started) -> InstallResult:
  result_path = os.path.join(folder, 'result.json')
  if os.path.isfile(result_path) and not force:
    with open(result_path) as f:
      cached = InstallResult(**json.load(f))
    if not cached.ok or os.path.isdir(cached.layer):
      cached.cached = True
      return cached
  repo = source if os.path.isdir(source) else _unpack_sdist(source, os.path.join(folder, 'src'))
  venv = os.path.join(folder, 'venv')
  pip_cache = os.path.join(os.path.expanduser(config.cache_dir), 'pip-cache')
  os.makedirs(pip_cache, exist_ok=True)
  propose = proposer_lib.make_proposer(config.proposer, base_url=config.model_base_url,
                                       model_name=config.model_name)
  history: list[proposer_lib.AttemptRecord] = []
  error, verification = 'the proposer had no plan for this repository', None
  has_tests = bool(test_files(repo))
  if not has_tests:  # nothing could verify an install (many sdists omit tests)
    error = (f'{repo} ships no tests (no test_*.py or *_test.py files): an install '
             'cannot be verified; use a checkout of the repository that has its tests.')
  with egress.AllowlistProxy(config.allow_hosts) as proxy:
    while has_tests and len(history) < config.max_attempts:
      plan = propose(repo, history)
      if plan is None:
        break
      _make_venv(config.base_python(), venv)
      failed, error = _run_plan(plan, repo, venv, pip_cache, proxy, config)
      record = proposer_lib.AttemptRecord(plan, ok=False, failed_command=failed, error=error)
      if not failed:
        verification = verify.run_tests(repo, venv, plan.test_command, config.timeout_s,
                                        config.memory_mb, config.max_processes)
        record.test_summary = verification.summary()
        record.ok = (verification.collected > 0 and
                     verification.pass_fraction >= config.pass_fraction)
        if not record.ok:
          error = (f'{verification.collected} tests collected, {len(verification.passed)} '
                   f'passed (need {config.pass_fraction:.0%}):\n'
                   + verification.output[-4000:])
          # The proposer reads every missing module, not only the tail's.
          record.error = error + '\n' + '\n'.join(
              sorted(set(proposer_lib.missing_module_lines(verification.output))))
      history.append(record)
      if record.ok:
        break
  ok = bool(history) and history[-1].ok
  if not ok:
    shutil.rmtree(venv, ignore_errors=True)
  result = InstallResult(
      ok=ok, key=key, repo=repo, layer=venv if ok else '',
      test_command=history[-1].plan.test_command if ok else '',
      attempts=[h.to_json() for h in history],
      verification=verification.summary() if (ok and verification) else {},
      error='' if ok else error, duration_s=time.monotonic() - started)
  with open(result_path + '.tmp', 'w') as f:
    json.dump(result.to_json(), f, indent=1)
  os.replace(result_path + '.tmp', result_path)
  return result
