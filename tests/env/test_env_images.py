"""c2jax.env.env_images: what fails is said, and fails as infrastructure. The images
themselves are built and used by the docker gradings of tests/env/test_languages.py
(Rust, node), test_multilang_suite.py (Go) and test_auto_install.py (a Python layer)."""

import json

import pytest

from c2jax.env import env_images, tasks
from env_testlib import real_docker_engine


def test_a_task_the_sandbox_image_serves_needs_no_image():
  task = tasks.Task(id='t', repo='.', prompt='p', fail_to_pass=['x'])
  assert env_images.image_for(task) == ''


def test_an_unknown_language_and_a_missing_sandbox_image_are_named(monkeypatch):
  with pytest.raises(env_images.EnvImageError, match="'go', 'node', 'rust', 'python'"):
    env_images._toolchain('cobol', set())  # pylint: disable=protected-access
  with pytest.raises(env_images.EnvImageError, match='not a venv layer'):
    env_images._python_layer('/nonexistent/venv')  # pylint: disable=protected-access
  if why := real_docker_engine():
    pytest.skip(why)
  monkeypatch.setenv('C2JAX_DOCKER_IMAGE', 'c2jax-no-such-image:none')
  monkeypatch.setattr(env_images, '_BUILT', {})
  with pytest.raises(env_images.EnvImageError, match='tools/setup.sh'):
    env_images.build('go')


def test_a_missing_image_is_an_infrastructure_error_of_the_episode(tmp_path, monkeypatch):
  if why := real_docker_engine():
    pytest.skip(why)
  from c2jax.eval import oracle, runner  # pylint: disable=g-import-not-at-top

  monkeypatch.setenv('C2JAX_DOCKER_IMAGE', 'c2jax-no-such-image:none')
  monkeypatch.setattr(env_images, '_BUILT', {})
  (tmp_path / 'repo').mkdir()
  task = tasks.Task(id='go-task', repo=str(tmp_path / 'repo'), prompt='fix it',
                    fail_to_pass=['example.com/x/TestX'], language='go', test_parser='go')
  summary = runner.evaluate_tasks(oracle.OraclePolicy('docker'), [task], tmp_path / 'run',
                                  retries=0, progress=False)
  overall = summary['overall']
  assert overall['infra_errors'] == 1 and overall['episodes'] == 0
  assert overall['by_language']['go']['infra_errors'] == 1
  # It failed making the Go environment image, before any container started.
  (record,) = [json.loads(line) for line in (tmp_path / 'run' / 'results.jsonl').open()]
  assert 'EnvImageError' in record['infra_error'] and 'tools/setup.sh' in record['infra_error']


def test_the_build_command_names_an_unknown_language_and_skips_a_missing_toolchain(
    monkeypatch, capsys):
  assert env_images.main(['cobol']) == 2
  assert "unknown language(s) ['cobol']" in capsys.readouterr().err
  monkeypatch.setattr(env_images.shutil, 'which', lambda name: None)
  assert env_images.main(['go', 'rust']) == 0
  out = capsys.readouterr().out
  assert 'go: skipped, go is not installed' in out and 'rust: skipped, rustc is not' in out


def test_a_second_process_waits_for_the_image_the_first_is_building():
  """The lock build() holds while it builds a tag: another process taking it for the same
  tag waits until the first lets go (then finds the image and builds nothing)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  tag = f'c2jax-env:test-lock-{time.time_ns()}'
  other = ('import sys, time\nfrom c2jax.env import env_images\nprint("trying", flush=True)\n'
           'started = time.monotonic()\nwith env_images._host_lock(sys.argv[1]):\n'
           '  print(f"waited {time.monotonic() - started:.2f}", flush=True)\n')
  with env_images._host_lock(tag):  # pylint: disable=protected-access
    child = subprocess.Popen([sys.executable, '-c', other, tag], stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline() == 'trying\n'
    time.sleep(1.0)
    assert child.poll() is None  # still waiting
  out, _ = child.communicate(timeout=60)
  assert child.returncode == 0 and float(out.split()[-1]) >= 0.9, out
