"""The docker backend through the real `docker` SDK against a fake Engine API server."""

import pytest

from c2jax.env import sandbox as sandbox_lib
from c2jax.env import tools as tools_lib
import fake_docker_engine


@pytest.fixture(scope='module')
def engine():
  fake = fake_docker_engine.FakeEngine()
  yield fake
  fake.close()


@pytest.fixture
def dbox(engine, repo):
  with sandbox_lib.make_sandbox('docker', repo, base_url=engine.base_url, memory_mb=256,
                                max_processes=32, timeout_s=10) as box:
    yield box


def test_limits_reach_the_engine(engine, dbox):
  create = [body for method, path, body in engine.requests
            if path == '/containers/create'][-1]
  host = create['HostConfig']
  assert host['Memory'] == host['MemorySwap'] == 256 << 20
  assert host['PidsLimit'] == 32
  assert host['NetworkMode'] == 'none'
  assert create['WorkingDir'] == '/workspace'


def test_exec_files_and_listing(dbox):
  result = dbox.run_shell('cat pkg/text.py; echo made > out.txt; exit 5')
  assert result.exit_code == 5 and 'def shout' in result.text
  assert dbox.read_file('out.txt') == b'made\n'
  dbox.write_file('deep/new.txt', b'hi')
  assert dbox.read_file('deep/new.txt') == b'hi'
  assert 'deep/new.txt' in dbox.list_files() and 'pkg/mathx.py' in dbox.list_files()
  with pytest.raises(FileNotFoundError):
    dbox.read_file('missing')
  with pytest.raises(sandbox_lib.PathOutsideWorkspaceError):
    dbox.read_file('../etc/passwd')


def test_timeout_and_leftover_processes(engine, dbox):
  result = dbox.run_shell('sleep 60', timeout_s=1)
  assert result.timed_out and result.exit_code == 137
  result = dbox.run_shell('sleep 30 & echo started')
  assert result.exit_code == 0 and result.text == 'started\n'
  # Every command is wrapped so that, in a real container, what it left running is
  # killed when it ends (everything but the container's init).
  cmd = [body['Cmd'] for method, path, body in engine.requests if path.endswith('/exec')][-1]
  assert cmd[:2] == ['/bin/sh', '-c'] and 'kill -9 -1' in cmd[2]
  assert cmd[4:] == ['/bin/sh', '-c', 'sleep 30 & echo started']


def test_output_limit(engine, repo):
  with sandbox_lib.make_sandbox('docker', repo, base_url=engine.base_url,
                                max_output_bytes=1000) as box:
    result = box.run_shell('seq 1 100000')
  assert result.truncated and len(result.output) == 1000


def test_snapshot_fork_reset(dbox):
  dbox.write_file('state.txt', b'one')
  child = dbox.fork()
  dbox.write_file('state.txt', b'two')
  assert child.read_file('state.txt') == b'one'
  child.write_file('child.txt', b'c')
  assert 'child.txt' not in dbox.list_files()
  dbox.reset()
  assert 'state.txt' not in dbox.list_files()
  child.reset()
  assert child.read_file('state.txt') == b'one' and 'child.txt' not in child.list_files()
  child.close()


def test_tools_work_on_the_docker_backend(dbox):
  box = tools_lib.Toolbox(dbox)
  _, obs = box.run_turn(
      '<tool_call>{"name": "edit_file", "arguments": {"path": "pkg/mathx.py", '
      '"old_string": "a + b", "new_string": "b + a"}}</tool_call>'
      '<tool_call>{"name": "grep", "arguments": {"pattern": "b \\\\+ a"}}</tool_call>'
      '<tool_call>{"name": "list_dir", "arguments": {"path": "pkg"}}</tool_call>')
  assert [o.ok for o in obs] == [True, True, True], obs
  assert obs[1].output == 'pkg/mathx.py:2:     return b + a'
  assert obs[2].output == '__init__.py\nmathx.py\ntext.py'


def test_unreachable_engine_is_a_clear_error(repo):
  with pytest.raises(Exception, match='Error while fetching server API version'):
    sandbox_lib.make_sandbox('docker', repo, base_url='tcp://127.0.0.1:1')
