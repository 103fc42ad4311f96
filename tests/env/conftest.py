"""Shared fixtures: a small repository and sandboxes over it."""

import docker
import pytest

from c2jax.env import bubblewrap
import env_testlib
from env_testlib import write_tree
import fake_docker_engine


@pytest.fixture
def repo(tmp_path):
  return write_tree(tmp_path / 'repo', {
      'README.md': 'A tiny project.\n',
      'pkg/__init__.py': '',
      'pkg/mathx.py': 'def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n'
                      '    return a * b\n',
      'pkg/text.py': 'def shout(s):\n    return s.upper() + "!"\n',
  })


@pytest.fixture
def box(repo):
  with bubblewrap.BubblewrapSandbox(repo, timeout_s=20) as sandbox:
    yield sandbox


@pytest.fixture(scope='module')
def real_docker():
  """A client of the real Docker engine (tools/setup.sh starts it and builds the sandbox
  image); skips where there is none. (The tests leave no images: a fork's snapshot image
  goes when the fork closes.)"""
  reason = env_testlib.real_docker_engine()
  if reason:
    pytest.skip(reason)
  client = docker.from_env()
  yield client
  client.close()


@pytest.fixture(scope='module', params=['fake', 'real'])
def docker_engine(request):
  """(name, make_sandbox keyword arguments, the FakeEngine or None): the docker backend's
  tests run against the fake engine everywhere, and against the real one where it is up."""
  if request.param == 'fake':
    fake = fake_docker_engine.FakeEngine()
    yield 'fake', {'base_url': fake.base_url}, fake
    fake.close()
  else:
    request.getfixturevalue('real_docker')
    yield 'real', {}, None
