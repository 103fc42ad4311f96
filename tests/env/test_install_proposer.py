"""Install proposers: heuristics over packaging files, error-driven additions, and a
model proposer against a local OpenAI-compatible endpoint."""

import http.server
import json
import threading

import pytest

from c2jax.env.install import proposer
from env_testlib import write_tree


@pytest.fixture
def project(tmp_path):
  return write_tree(tmp_path / 'p', {
      'setup.py': 'from setuptools import setup\nsetup()\n',
      'setup.cfg': '[metadata]\nname = p\n[options.extras_require]\ntesting = pytest-mock\n'
                   'docs = sphinx\n',
      'tox.ini': '[testenv]\ndeps =\n  hypothesis>=6\n  py38: oldthing\n  {[base]deps}\n'
                 'commands = pytest\n',
      'noxfile.py': 'def tests(session):\n  session.install("freezegun", "-e", ".")\n',
      'Makefile': 'test:\n\tpip install responses && pytest\n',
      'requirements-dev.txt': 'coverage\n', 'requirements.txt': 'attrs\n',
      'docs/requirements.txt': 'sphinx\n', 'tests/test_p.py': 'def test():\n  pass\n'})


def test_heuristic_plans_read_every_packaging_file(project):
  first, *rest = proposer.heuristic_plans(project)
  commands = ' ; '.join(first.commands)
  assert "pip install -e '.[testing]'" in commands
  for requirement in ('-r requirements-dev.txt', '-r requirements.txt', 'hypothesis>=6',
                      'freezegun', 'responses', 'pytest'):
    assert requirement in commands, (requirement, commands)
  assert 'oldthing' not in commands and 'sphinx' not in commands and '[base]' not in commands
  assert '{tests}' in first.test_command and 'PYTHONPATH=.' in first.test_command
  # Plainer fallbacks follow, all different.
  assert len({p.commands for p in [first] + rest}) == len(rest) + 1 >= 3


def test_heuristic_adds_modules_the_tests_could_not_import(project):
  propose = proposer.make_proposer('heuristic')
  first = propose(project, [])
  failed = proposer.AttemptRecord(first, ok=False, error=(
      "E   ModuleNotFoundError: No module named 'yaml'\n"
      "E   ModuleNotFoundError: No module named 'pretend.sub'"))
  second = propose(project, [failed])
  assert second.commands[:len(first.commands)] == first.commands
  assert set(second.commands[len(first.commands):]) == {
      f'{proposer.PIP} pyyaml', f'{proposer.PIP} pretend'}
  # An install command that failed moves on to the next plan instead.
  broken = proposer.AttemptRecord(first, ok=False, failed_command=first.commands[0],
                                  error='ERROR: No matching distribution')
  assert propose(project, [broken]).commands != first.commands


class _FakeChat(http.server.BaseHTTPRequestHandler):
  replies: list = []
  requests: list = []

  def do_POST(self):  # noqa: N802
    body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
    type(self).requests.append(body)
    content = type(self).replies.pop(0)
    data = json.dumps({'id': 'x', 'object': 'chat.completion', 'created': 0, 'model': 'm',
                       'choices': [{'index': 0, 'finish_reason': 'stop', 'message': {
                           'role': 'assistant', 'content': content}}]}).encode()
    self.send_response(200)
    self.send_header('Content-Type', 'application/json')
    self.send_header('Content-Length', str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    pass


def test_model_proposer_reads_repo_and_errors_and_falls_back(project):
  server = http.server.HTTPServer(('127.0.0.1', 0), _FakeChat)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    _FakeChat.replies = [
        'Sure: {"commands": ["python -m pip install -e .", "python -m pip install tox"], '
        '"test_command": "python -m pytest -rA"}', 'I do not know.']
    propose = proposer.make_proposer(
        'model', base_url=f'http://127.0.0.1:{server.server_port}/v1', model_name='m')
    earlier = proposer.AttemptRecord(proposer.Plan(('pip install nothing',), 'pytest'),
                                     ok=False, failed_command='pip install nothing',
                                     error='ERROR: boom-unique-error')
    plan = propose(project, [earlier])
    assert plan.commands == ('python -m pip install -e .', 'python -m pip install tox')
    assert plan.test_command == 'python -m pytest -rA {tests}'
    prompt = _FakeChat.requests[0]['messages'][1]['content']
    assert 'boom-unique-error' in prompt and 'setup.cfg' in prompt and 'tox.ini' in prompt
    fallback = propose(project, [])  # unparsable reply: the heuristic plan
    assert fallback == proposer.heuristic_plans(project)[0]
  finally:
    server.shutdown()
  with pytest.raises(ValueError, match='model_base_url'):
    proposer.make_proposer('model')


def test_a_repository_without_tests_fails_at_once(tmp_path):
  from c2jax.env.install import InstallConfig, install
  repo = write_tree(tmp_path / 'notests', {'setup.py': 'from setuptools import setup\n'
                                                       'setup(name="x")\n', 'x.py': ''})
  result = install(repo, InstallConfig(cache_dir=str(tmp_path / 'envs')))
  assert not result.ok and result.attempts == [] and 'ships no tests' in result.error
  assert 'ships no tests' in result.report()


def test_verification_reads_colored_pytest_output():
  from c2jax.env.install import verify
  out = ('\x1b[32mPASSED\x1b[0m tests/test_a.py::test_x\n'
         '\x1b[31mFAILED\x1b[0m tests/test_a.py::test_y - assert 0\n'
         'ERROR tests/test_b.py - ModuleNotFoundError\n'
         'SKIPPED [1] tests/test_a.py:9: needs network\n')
  result = verify.parse(out, 1)
  assert result.passed == ['tests/test_a.py::test_x']
  assert result.failed == ['tests/test_a.py::test_y', 'tests/test_b.py']
  assert result.skipped == 1 and result.pass_fraction == 1 / 3
  assert '--color=no' in proposer.pytest_command('.')


def test_heuristic_pins_old_pytest_for_old_conftest_hooks(project):
  propose = proposer.make_proposer('heuristic')
  first = propose(project, [])
  failed = proposer.AttemptRecord(first, ok=False, error=(
      "Argument(s) {'path'} are declared in the hookimpl but can not be found in the "
      "hookspec"))
  second = propose(project, [failed])
  assert f"{proposer.PIP} 'pytest<8'" in second.commands
  assert f'{proposer.PIP} pytest' not in second.commands
