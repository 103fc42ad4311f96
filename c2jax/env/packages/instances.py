"""Instance checkouts made again from the released packages a suite was built from.

A suite built from packages (`c2jax tasks build --repo npm:...|deb:...|pypi:...`) names
each package's exact spec as `repo` and, for npm and Debian packages, the git commit
packages.fetch made of it as `base_commit`. So the JSONL alone is the suite, as a
SWE-bench JSONL is: small enough to commit, with no repository beside it.

  jsonl, repos_root = instances.materialise('configs/suites/multilang.jsonl')
  tasks = tasks_lib.load_swebench_jsonl(jsonl, repos_root)

For each instance without a checkout: fetch the package (cached), check that it gives
the recorded `base_commit` (else the registry changed what that version holds: rebuild
the suite), prepare it once per package as the builder did (npm install; Debian
packages carry their dependencies already; a Python sdist gets its verified venv layer
from `c2jax tasks install`, cached), copy it, apply the gold `patch` in reverse (the
planted bug or the reverted function) and delete the test files `test_patch` brings
back at grading. That is the builder's task repository, file for file.

Checkouts live under `<cache_dir>/instances/<instance_id>` with a note of what made them
(base commit, patch hash) beside, so a suite rebuilt with other edits under the same ids
is made again. Processes of one host may make the same suite at once (actors starting
together): a lock per checkout makes each once, in a private staging folder. The returned
JSONL is the suite with each Python instance's environment layer filled in (a path of
this machine, so the committed file leaves it empty).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile

from c2jax.env import packages


def is_package_suite(path: str) -> bool:
  """Whether every record of the JSONL at `path` names a package spec as its repo."""
  records = _records(path)
  return bool(records) and all(_is_package(r.get('repo', '')) for r in records)


def _is_package(repo: str) -> bool:
  return repo.split(':', 1)[0] in packages.REGISTRIES and ':' in repo


def _records(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _patch_key(record: dict) -> str:
  text = record.get('patch', '') + '\0' + record.get('test_patch', '')
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def added_files(test_patch: str) -> list[str]:
  """Paths a test_patch adds (its `--- /dev/null` / `+++ b/PATH` pairs)."""
  return re.findall(r'^--- /dev/null\n\+\+\+ b/(.+)$', test_patch, re.M)


def _prepared(package: packages.Package, language: str, timeout_s: float) -> str:
  """The package's tree after its language's prepare step, made once per package."""
  from c2jax.env import languages  # pylint: disable=g-import-not-at-top
  folder = os.path.join(os.path.dirname(package.path), 'prepared')
  if os.path.isdir(folder):
    return folder
  staging = tempfile.mkdtemp(prefix='.prepare-', dir=os.path.dirname(package.path))
  tree = os.path.join(staging, 'tree')
  try:
    shutil.copytree(package.path, tree, symlinks=True, ignore=shutil.ignore_patterns('.git'))
    languages.get(language).prepare(tree, timeout_s)
    try:
      os.rename(tree, folder)
    except OSError:
      if not os.path.isdir(folder):  # else another process prepared it first
        raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return folder


def _python_base(package: packages.Package, timeout_s: float) -> tuple[str, str]:
  """(unpacked sdist, venv layer) of a Python package, from `c2jax tasks install`."""
  from c2jax.env import install as install_lib  # pylint: disable=g-import-not-at-top
  result = install_lib.install(package.path, install_lib.InstallConfig(timeout_s=timeout_s))
  if not result.ok:
    raise packages.FetchError(f'{package.spec} does not install any more: '
                              f'{result.error[-500:]}')
  return result.repo, result.layer


@contextlib.contextmanager
def _locked(path: str):
  """An exclusive lock on `path` between processes of this host (actors making the
  same suite's checkouts at once)."""
  with open(path, 'a') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _make(record: dict, base: str, dest: str, timeout_s: float) -> None:
  staging = tempfile.mkdtemp(prefix='.partial-', dir=os.path.dirname(dest))
  os.rmdir(staging)  # copytree makes it
  shutil.copytree(base, staging, symlinks=True,
                  ignore=shutil.ignore_patterns('.git', '__pycache__', '.pytest_cache'))
  proc = subprocess.run(['git', 'apply', '-R', '--whitespace=nowarn', '-'], cwd=staging,
                        input=record['patch'], capture_output=True, text=True,
                        timeout=timeout_s, check=False)
  if proc.returncode != 0:
    shutil.rmtree(staging, ignore_errors=True)
    raise packages.FetchError(f'Instance {record["instance_id"]}: its gold patch does not '
                              f'apply in reverse to {record["repo"]} ({proc.stderr.strip()}); '
                              'the package is not the one the suite was built from.')
  for rel in added_files(record.get('test_patch', '')):
    path = os.path.join(staging, rel)
    if os.path.isfile(path):
      os.remove(path)
  shutil.rmtree(dest, ignore_errors=True)
  os.rename(staging, dest)


def materialise(path: str, cache_dir: str = packages.DEFAULT_CACHE,
                timeout_s: float = 600.0, log=print) -> tuple[str, str]:
  """(a JSONL to load, the repos_root of its checkouts) for the package-built suite at
  `path`; checkouts made before are reused."""
  records = _records(path)
  strangers = [r['instance_id'] for r in records if not _is_package(r.get('repo', ''))]
  if strangers:
    raise ValueError(f'{path}: instance(s) {strangers[:3]} name no package as their repo '
                     '(npm:, deb:, pypi:); give their checkouts with repos_root instead.')
  root = os.path.join(os.path.expanduser(cache_dir), 'instances')
  os.makedirs(root, exist_ok=True)
  bases: dict[str, tuple[str, str]] = {}
  made = 0
  for record in records:
    dest = os.path.join(root, record['instance_id'])
    note_path = dest + '.json'
    note = {'repo': record['repo'], 'base_commit': record.get('base_commit', ''),
            'patch': _patch_key(record)}
    if record['repo'] not in bases:
      package = packages.fetch(record['repo'], cache_dir=cache_dir, timeout_s=timeout_s)
      if record.get('base_commit') and package.base_commit != record['base_commit']:
        raise packages.FetchError(
            f'{record["repo"]} now gives commit {package.base_commit}, but instance '
            f'{record["instance_id"]} was built on {record["base_commit"]}: the registry '
            'changed what that version holds; rebuild the suite.')
      language = record.get('language', '')
      bases[record['repo']] = (_python_base(package, timeout_s)
                               if language in ('', 'python')
                               else (_prepared(package, language, timeout_s), ''))
    base, layer = bases[record['repo']]
    if layer:
      record['environment'] = layer
    if _made(dest, note_path, note):
      continue
    with _locked(dest + '.lock'):
      if _made(dest, note_path, note):  # by another process while this one waited
        continue
      _make(record, base, dest, timeout_s)
      with open(note_path + '.tmp', 'w') as f:
        json.dump(note, f)
      os.replace(note_path + '.tmp', note_path)
    made += 1
  if made and log:
    log(f'made {made} of {len(records)} instance checkouts under {root}')
  digest = hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()[:12]
  local = os.path.join(root, f'{os.path.basename(path).removesuffix(".jsonl")}-{digest}.jsonl')
  fd, tmp = tempfile.mkstemp(prefix='.suite-', dir=root)
  with os.fdopen(fd, 'w') as f:
    for record in records:
      f.write(json.dumps(record) + '\n')
  os.replace(tmp, local)
  return local, root


def _made(dest: str, note_path: str, note: dict) -> bool:
  if not (os.path.isdir(dest) and os.path.isfile(note_path)):
    return False
  with open(note_path) as f:
    return json.load(f) == note
