"""The docker backend through the real `docker` SDK, against a fake Engine API server
everywhere and against the real engine where one is up (tools/setup.sh starts it and
builds its image)."""

import time

import docker
import pytest

from c2jax.env import sandbox as sandbox_lib
from c2jax.env import tools as tools_lib


@pytest.fixture
def dbox(docker_engine, repo):
  _, engine_args, _ = docker_engine
  with sandbox_lib.make_sandbox('docker', repo, memory_mb=256, max_processes=32,
                                timeout_s=10, **engine_args) as box:
    yield box


def test_limits_reach_the_engine(docker_engine, dbox):
  name, _, fake = docker_engine
  if name == 'fake':
    create = [body for method, path, body in fake.requests
              if path == '/containers/create'][-1]
    host = create['HostConfig']
    assert create['WorkingDir'] == '/workspace'
  else:
    dbox._container.reload()  # pylint: disable=protected-access
    host = dbox._container.attrs['HostConfig']  # pylint: disable=protected-access
  assert host['Memory'] == host['MemorySwap'] == 256 << 20
  assert host['PidsLimit'] == 32 and host['NanoCpus'] == 10**9
  assert host['NetworkMode'] == 'none'
  assert host['CapDrop'] == ['ALL'] and host['SecurityOpt'] == ['no-new-privileges']
  assert host['StorageOpt']['size'].endswith('m')
  assert host['Ulimits'] == [{'Name': 'fsize', 'Soft': 256 << 20, 'Hard': 256 << 20}]


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
  # Files written from the host are the command's to change.
  assert dbox.run_shell('echo more >> deep/new.txt && cat deep/new.txt').text == 'himore\n'


def test_output_keeps_the_order_stdout_and_stderr_were_written_in(dbox):
  # Test logs interleave the two (cargo's `Running <binary>` headers go to stderr, the
  # results they head to stdout): the parsers read them in the order they were written.
  result = dbox.run_shell('for i in $(seq 1 300); do echo out$i; echo err$i >&2; done')
  assert result.text == ''.join(f'out{i}\nerr{i}\n' for i in range(1, 301))


def test_timeout_and_leftover_processes(docker_engine, dbox):
  name, _, fake = docker_engine
  start = time.monotonic()
  result = dbox.run_shell('sleep 60', timeout_s=1)
  assert result.timed_out and result.exit_code == 137
  assert time.monotonic() - start < 15
  result = dbox.run_shell('sleep 30 & echo started')
  assert result.exit_code == 0 and result.text == 'started\n'
  if name == 'fake':
    # Every command is wrapped so that, in a real container, what it left running is
    # killed when it ends (everything but the container's init).
    cmd = [body['Cmd'] for method, path, body in fake.requests if path.endswith('/exec')][-1]
    assert cmd[:2] == ['/bin/sh', '-c'] and 'kill -9 -1' in cmd[2]
    assert cmd[4:] == ['/bin/sh', '-c', 'sleep 30 & echo started']
  else:  # only the container's init (and its sleep) and this `ps` are left: no zombie
    ps = dbox.exec(['ps', '-eo', 'stat,args']).text
    assert 'sleep 30' not in ps and 'Z' not in ''.join(
        line.split()[0] for line in ps.splitlines()[1:]), ps


def test_output_limit(docker_engine, repo):
  _, engine_args, _ = docker_engine
  with sandbox_lib.make_sandbox('docker', repo, max_output_bytes=1000, **engine_args) as box:
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
  assert 'state.txt' not in dbox.list_files() and 'pkg/mathx.py' in dbox.list_files()
  assert dbox.run_shell('cat pkg/text.py').exit_code == 0
  child.reset()
  assert child.read_file('state.txt') == b'one' and 'child.txt' not in child.list_files()
  snapshot = child._base[0]  # pylint: disable=protected-access
  child.close()
  with pytest.raises(docker.errors.ImageNotFound):  # the fork's snapshot went with it
    dbox._client.images.get(snapshot)  # pylint: disable=protected-access


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


def test_missing_image_names_the_fix(docker_engine, repo):
  _, engine_args, _ = docker_engine
  with pytest.raises(RuntimeError, match='no image .*tools/setup.sh'):
    sandbox_lib.make_sandbox('docker', repo, image='sha256:' + '0' * 64, **engine_args)


def test_unreachable_engine_is_a_clear_error(repo):
  with pytest.raises(docker.errors.DockerException,
                     match='Error while fetching server API version'):
    sandbox_lib.make_sandbox('docker', repo, base_url='tcp://127.0.0.1:1')
