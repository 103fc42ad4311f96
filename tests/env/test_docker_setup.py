"""tools/setup_docker.sh never fails the set-up: where it may not start an engine it says
why and exits 0 (CI runs it from tools/setup.sh before the tests)."""

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / 'tools' / 'setup_docker.sh'


def test_without_privileges_it_says_why_and_goes_on(tmp_path):
  if os.getuid() != 0 or not shutil.which('setpriv'):
    pytest.skip('needs root and setpriv to run the script as an unprivileged user')
  # A copy the unprivileged user can read: the checkout (and pytest's tmp_path) may sit
  # under a directory only root may enter (a mktemp -d clone is 0700).
  readable = pathlib.Path(tempfile.mkdtemp(prefix='c2jax-setup-docker-'))
  try:
    readable.chmod(0o755)
    script = readable / SCRIPT.name
    shutil.copyfile(SCRIPT, script)
    script.chmod(0o644)
    result = subprocess.run(
        ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', 'bash', str(script)],
        env={'PATH': os.environ['PATH'], 'DOCKER_HOST': f'unix://{readable}/no.sock'},
        capture_output=True, text=True, timeout=60, check=False)
  finally:
    shutil.rmtree(readable, ignore_errors=True)
  assert result.returncode == 0, result.stderr
  assert 'no Docker engine reachable and not root' in result.stderr


def _dockerd_running() -> bool:
  try:
    with open('/var/run/docker.pid') as f:
      os.kill(int(f.read()), 0)
  except (OSError, ValueError):
    return False
  return True


def test_an_engine_that_does_not_answer_is_not_doubled(tmp_path):
  # (Without a running dockerd the script would start one: not a test's business.)
  if os.getuid() != 0 or not _dockerd_running():
    pytest.skip('needs root and a running dockerd')
  result = subprocess.run(
      ['bash', str(SCRIPT)],
      env={'PATH': os.environ['PATH'], 'DOCKER_HOST': f'unix://{tmp_path}/no.sock'},
      capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 0, result.stderr
  assert 'not starting another' in result.stderr
