"""Auto-install through the egress allowlist, and task builders over installed repos.

Real PyPI fetches (pytest, setuptools, six) through the allowlist proxy; no other host is
contacted (the refused one is refused by the proxy before any connection).
"""

import pytest

from c2jax.env import bubblewrap, env_images, reward, sandbox, task_builder
from c2jax.env import tasks as tasks_lib
from c2jax.env.install import AllowlistProxy, InstallConfig, install
from env_testlib import calc_repo as _repo, grade, real_docker_engine, write_tree


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp('envs'))


def test_egress_allows_only_the_allowlist(tmp_path):
  repo = write_tree(tmp_path / 'r', {'a.txt': 'x'})
  with AllowlistProxy(('pypi.org',)) as proxy:
    with bubblewrap.BubblewrapSandbox(
        repo, ro_binds=bubblewrap.default_ro_binds() + (proxy.folder,), timeout_s=60) as box:
      code = 'curl -sS -o /dev/null -w "%{http_code}\\n" '
      allowed = box.run_shell(proxy.wrap(code + 'https://pypi.org/simple/six/'))
      refused = box.run_shell(proxy.wrap(code + 'https://example.com/'))
      direct = box.run_shell(code + '--noproxy "*" https://pypi.org/simple/six/')
  assert allowed.text.strip().endswith('200'), allowed.text
  assert '403' in refused.text and refused.exit_code != 0, refused.text
  assert direct.exit_code != 0  # no route out of the sandbox but the proxy
  assert proxy.refused == ['example.com:443'] and proxy.allowed == ['pypi.org:443']


def test_host_patterns():
  from c2jax.env.install import egress
  hosts = ('pypi.org', '*.pythonhosted.org')
  assert egress.host_allowed('files.pythonhosted.org', hosts)
  assert egress.host_allowed('PyPI.org.', hosts)
  assert not egress.host_allowed('pypi.org.evil.com', hosts)
  assert not egress.host_allowed('pythonhosted.org.evil', hosts)


# Passes in the file's order and fails once test_z_total has run: grading names
# FAIL_TO_PASS ids first, so under a bug in `total` it would fail the gold patch.
_ORDER_TESTS = '''from calc import total

STATE = []


def test_a_before_total():
  assert STATE == []


def test_z_total():
  STATE.append(1)
  assert total([1, 2]) == 3
'''


@pytest.fixture(scope='module')
def pure_python_tasks(tmp_path_factory, cache):
  """A pure-Python repository installed (its layer) and a suite of tasks built over it;
  what the two tests below grade, in bubblewrap and in the docker engine."""
  tmp_path = tmp_path_factory.mktemp('pure_python')
  repo = _repo(tmp_path / 'calc', 'calc', [])
  write_tree(repo, {'tests/test_order.py': _ORDER_TESTS})
  result = install(repo, InstallConfig(cache_dir=cache))
  assert result.ok, result.report()
  out = str(tmp_path / 'suite.jsonl')
  records = task_builder.build_suite(result, out, max_tasks=3, max_candidates=12)
  tasks = tasks_lib.load_swebench_jsonl(out, str(tmp_path / 'suite.repos'))
  return repo, result, records, tasks


@pytest.mark.slow
def test_install_pure_python_then_build_tasks(pure_python_tasks, cache):
  repo, result, records, tasks = pure_python_tasks
  assert result.verification['passed'] == 6 and result.verification['collected'] == 6
  assert install(repo, InstallConfig(cache_dir=cache)).cached  # by repository hash

  assert {r['created_by'] for r in records} == {'mutate', 'revert'}
  assert len(tasks) == len(records) >= 2
  # Graded as grading runs them, the order-dependent test is not a PASS_TO_PASS test of
  # a task whose FAIL_TO_PASS tests run test_z_total first.
  in_total = [t for t in tasks if 'tests/test_order.py::test_z_total' in t.fail_to_pass]
  assert in_total
  assert all('tests/test_order.py::test_a_before_total' not in t.pass_to_pass
             for t in in_total)
  for task in tasks:
    assert task.environment == result.layer
    # The tests that catch the bug are hidden from the agent's repository.
    with sandbox.make_task_sandbox('bubblewrap', task) as box:
      assert 'tests/test_calc.py' not in box.list_files()
      before = reward.grade(box, task)
      assert not any(before.passed[t] for t in task.fail_to_pass), before.output
      assert all(before.passed[t] for t in task.pass_to_pass), before.output
      box.write_file('gold.patch', task.metadata['gold_patch'].encode())
      assert box.run_shell('patch -p1 < gold.patch && rm gold.patch').exit_code == 0
      after = reward.grade(box, task)
    assert after.reward == 1.0, after.output


@pytest.mark.slow
def test_pure_python_tasks_grade_the_same_in_the_docker_engine(pure_python_tasks):
  """In the docker engine the layer runs from an environment image (the layer and the
  interpreter it was made with: c2jax/env/env_images.py), the test ids unchanged."""
  why_not = real_docker_engine()
  if why_not:
    pytest.skip(why_not)
  _, _, _, tasks = pure_python_tasks
  task = tasks[0]
  try:
    assert grade(task, '', 'docker').reward == 0.0
    solved = grade(task, task.metadata['gold_patch'], 'docker')
    assert solved.reward == 1.0, solved.output[-2000:]
  finally:
    # The layer lives in this test's temporary folder: its image would never be used
    # again (360 MB a run).
    _remove_image(env_images._BUILT.pop(('python', task.environment), ''))  # pylint: disable=protected-access


def _remove_image(tag: str) -> None:
  import docker  # pylint: disable=g-import-not-at-top

  if tag:
    client = docker.from_env()
    try:
      client.images.remove(tag, force=True)
    finally:
      client.close()


def test_install_with_a_registry_dependency(tmp_path, cache):
  repo = _repo(tmp_path / 'calcsix', 'calcsix', ['six==1.16.0'],
               extra='import six\nassert six.PY3\n')
  result = install(repo, InstallConfig(cache_dir=cache))
  assert result.ok, result.report()
  with bubblewrap.BubblewrapSandbox(repo, env_layer=result.layer) as box:
    shown = box.run_shell('python -c "import six; print(six.__version__)"')
  assert shown.text.strip() == '1.16.0'


@pytest.mark.slow
def test_install_failure_reports_reason_and_commands(tmp_path, cache):
  repo = _repo(tmp_path / 'broken', 'broken', ['c2jax-no-such-distribution-xyz==1.0'])
  result = install(repo, InstallConfig(cache_dir=cache, max_attempts=2))
  assert not result.ok and result.layer == ''
  assert len(result.attempts) == 2
  assert 'python -m pip install -e .' in result.attempts[0]['commands']
  assert 'c2jax-no-such-distribution-xyz' in result.error
  report = result.report()
  assert 'FAILED to install' in report and '$ python -m pip install -e .' in report
  assert install(repo, InstallConfig(cache_dir=cache, max_attempts=2)).cached


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match='pass_fraction'):
    InstallConfig(pass_fraction=0)
  with pytest.raises(ValueError, match='allow_hosts'):
    InstallConfig(allow_hosts=())
  with pytest.raises(ValueError, match='proposer'):
    InstallConfig(proposer='oracle')
