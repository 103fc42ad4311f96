"""The committed multi-language suite (configs/suites/multilang.jsonl): what it holds,
that its records are what tools/tasks/build_multilang.py lists, and that instances of it
made from their packages (the Go and Rust ones whose Debian packages are committed
fixtures, so offline) fail as given and pass with their gold patch, in bubblewrap and in
the docker engine from their language's environment image."""

import collections
from concurrent import futures
import json
import os
import shutil
import subprocess

import pytest

from c2jax.env import packages, tasks
from c2jax.env.packages import instances
from tools.tasks import build_multilang
from env_testlib import grade, real_docker_engine

REPO = os.path.join(os.path.dirname(__file__), '..', '..')
SUITE = os.path.join(REPO, build_multilang.SUITE)
FIXTURES = os.path.join(os.path.dirname(__file__), '..', 'fixtures', 'packages')
_SHLEX = 'golang-github-google-shlex-dev_0.0~git20191202.e7afc7f-1_all.deb'


def _records():
  with open(SUITE) as f:
    return [json.loads(line) for line in f if line.strip()]


def test_the_suite_is_forty_instances_in_four_languages_from_its_builds():
  records = _records()
  by_language = collections.Counter(r['language'] for r in records)
  assert len(records) >= 40 and len(by_language) >= 4, by_language
  assert all(count >= 8 for count in by_language.values()), by_language
  assert len({r['instance_id'] for r in records}) == len(records)
  built = collections.Counter(r['repo'] for r in records)
  assert built == {spec: tasks for spec, tasks, _ in build_multilang.BUILDS}
  for record in records:
    assert packages.is_spec(record['repo'])
    assert record['environment'] == ''  # a machine's venv path is never committed
    assert json.loads(record['FAIL_TO_PASS'])
    assert record['patch'].startswith('--- a/')
    if not record['repo'].startswith('pypi:'):
      assert len(record['base_commit']) == 40
    # The task loader takes every record as it is.
    tasks.Task(id=record['instance_id'], repo='.', prompt=record['problem_statement'],
               test_command=record['test_command'], test_parser=record['test_parser'],
               fail_to_pass=json.loads(record['FAIL_TO_PASS']), language=record['language'])


# Docker for Go only: Rust's environment image is ~1 GB (rustup's sysroot and gcc) and
# its episodes pass the same code; docs/tasks.md has the whole suite on docker.
@pytest.mark.slow
@pytest.mark.parametrize('deb, tools, backend', [
    ('golang-github-google-shlex-dev_0.0~git20191202.e7afc7f-1_all.deb', ('go',), 'bubblewrap'),
    ('golang-github-google-shlex-dev_0.0~git20191202.e7afc7f-1_all.deb', ('go',), 'docker'),
    ('librust-strsim-dev_0.10.0-1_amd64.deb', ('cargo',), 'bubblewrap')])
def test_committed_instances_are_made_from_their_packages_and_grade(tmp_path, deb, tools,
                                                                    backend):
  missing = [t for t in tools + ('bwrap',) if shutil.which(t) is None]
  if missing:
    pytest.skip(f'{missing} not installed')
  if backend == 'docker' and (why := real_docker_engine()):
    pytest.skip(why)
  cache = str(tmp_path / 'cache')
  package = packages.fetch(os.path.join(FIXTURES, deb), cache_dir=cache)
  record = next(r for r in _records() if r['repo'] == package.spec)
  assert record['base_commit'] == package.base_commit  # the committed fixture is that version
  one = str(tmp_path / 'one.jsonl')
  with open(one, 'w') as f:
    f.write(json.dumps(record) + '\n')
  (task,) = tasks.load_swebench_jsonl(*instances.materialise(one, cache_dir=cache, log=None))
  # On docker the episode starts from the language's environment image (the host's
  # toolchain and `patch`, built once: c2jax/env/env_images.py).
  assert grade(task, '', backend).reward == 0.0
  assert grade(task, record['patch'], backend).reward == 1.0


def test_processes_making_the_same_checkouts_at_once_agree(tmp_path):
  # Actors of one host starting on the same suite: each checkout is made once, whole,
  # and every caller gets the same JSONL (a lock per checkout, private staging folders).
  if shutil.which('git') is None:
    pytest.skip('git not installed')
  cache = str(tmp_path / 'cache')
  package = packages.fetch(os.path.join(FIXTURES, _SHLEX), cache_dir=cache)
  records = [r for r in _records() if r['repo'] == package.spec]
  suite = str(tmp_path / 'shlex.jsonl')
  with open(suite, 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
  with futures.ThreadPoolExecutor(4) as pool:
    made = list(pool.map(lambda _: instances.materialise(suite, cache_dir=cache, log=None),
                         range(4)))
  assert len(set(made)) == 1
  jsonl, root = made[0]
  assert sorted(t.id for t in tasks.load_swebench_jsonl(jsonl, root)) == sorted(
      r['instance_id'] for r in records)
  assert not [n for n in os.listdir(root) if n.startswith('.')]  # no staging left behind
  for record in records:  # the gold patch reversed exactly once: it applies forward
    check = subprocess.run(['git', 'apply', '--check', '-'], input=record['patch'],
                           cwd=os.path.join(root, record['instance_id']), text=True,
                           capture_output=True, check=False)
    assert check.returncode == 0, check.stderr
