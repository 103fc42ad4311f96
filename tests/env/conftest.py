"""Shared fixtures: a small repository and sandboxes over it."""

import pytest

from c2jax.env import bubblewrap
from env_testlib import write_tree


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
