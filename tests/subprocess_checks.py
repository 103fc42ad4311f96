"""Checks that run in a child Python (a fake-device count, or jax.distributed workers):
a clean environment for them and their one JSON result line."""

import json
import os
import pathlib
import subprocess

import pytest

from c2jax.parallel import distributed

REPO = pathlib.Path(__file__).resolve().parents[1]


def child_env(**extra) -> dict:
  """This environment for a child on CPU with the repo importable and no inherited
  jax.distributed settings; `extra` (values str()-ed) on top."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  for name in distributed.ENV.values():
    env.pop(name, None)
  env.update({k: str(v) for k, v in extra.items()})
  return env


def json_result(process: subprocess.Popen, timeout_s: float) -> dict:
  """The last stdout line of a child, parsed; fails the test, with the child's stderr, if
  it hangs past `timeout_s` or exits non-zero."""
  try:
    out, err = process.communicate(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    process.kill()
    out, err = process.communicate()
    pytest.fail(f"check process hung for {timeout_s}s:\n{err[-3000:]}")
  assert process.returncode == 0, err[-4000:]
  return json.loads(out.strip().splitlines()[-1])
