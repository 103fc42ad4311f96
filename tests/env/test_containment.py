"""Containment: what a hostile command inside the sandbox tries must fail or be cut off,
and the host must be unchanged afterwards."""

import hashlib
import os
import socket
import subprocess
import threading
import time
import uuid

import pytest

from c2jax.env import bubblewrap, cgroups, sandbox as sandbox_lib, tools as tools_lib
import env_testlib


def _digest(folder):
  h = hashlib.sha256()
  for dirpath, dirnames, filenames in sorted(os.walk(folder)):
    dirnames.sort()
    for name in sorted(filenames):
      full = os.path.join(dirpath, name)
      h.update(full.encode())
      with open(full, 'rb') as f:
        h.update(f.read())
  return h.hexdigest()


@pytest.fixture
def host_secret(tmp_path):
  """A host folder outside the workspace that the sandbox must neither read nor change."""
  folder = tmp_path / 'host'
  folder.mkdir()
  (folder / 'secret.txt').write_text('TOP-SECRET-VALUE')
  return str(folder)


@pytest.fixture
def hostile_box(repo, host_secret):
  box = bubblewrap.BubblewrapSandbox(repo, timeout_s=10, memory_mb=256,
                                     max_processes=64, max_output_bytes=1 << 20)
  before = (_digest(host_secret), _digest(repo))
  yield box
  box.close()
  assert (_digest(host_secret), _digest(repo)) == before, 'the host was changed'


def test_host_files_are_invisible_or_read_only(hostile_box, host_secret):
  result = hostile_box.run_shell(
      f'cat {host_secret}/secret.txt; ls /root /home /work; cat /etc/shadow; '
      f'echo x > {host_secret}/new.txt; echo x > /usr/evil; touch /etc/evil; '
      'mount -t tmpfs none /usr; echo done')
  assert 'TOP-SECRET-VALUE' not in result.text
  assert 'No such file or directory' in result.text
  assert 'Read-only file system' in result.text
  assert not os.path.exists('/usr/evil')
  assert result.text.rstrip().endswith('done')


def test_symlink_and_proc_escapes_fail(hostile_box, host_secret):
  result = hostile_box.run_shell(
      f'ln -s {host_secret}/secret.txt link; cat link; ln -s / rootlink; '
      f'cat rootlink{host_secret}/secret.txt; cat /proc/1/root{host_secret}/secret.txt; '
      'ls /proc | grep -c "^[0-9]"')
  assert 'TOP-SECRET-VALUE' not in result.text
  # Only the sandbox's own few processes are visible in /proc.
  assert int(result.text.split()[-1]) < 10
  # Host-side tools refuse links that leave the workspace.
  box = tools_lib.Toolbox(hostile_box)
  for path in ('link', f'rootlink{host_secret}/secret.txt'):
    obs = box.call(tools_lib.protocol.ToolCall(0, 'read_file', {'path': path}))
    assert not obs.ok and 'outside the workspace' in obs.output, obs
  obs = box.call(tools_lib.protocol.ToolCall(
      0, 'write_file', {'path': f'rootlink{host_secret}/new.txt', 'content': 'x'}))
  assert not obs.ok
  assert not os.path.exists(os.path.join(host_secret, 'new.txt'))


def test_no_network_not_even_the_hosts_loopback(hostile_box):
  server = socket.socket()
  server.bind(('127.0.0.1', 0))
  server.listen(1)
  port = server.getsockname()[1]
  script = ('import socket\n'
            'for addr in [("127.0.0.1", %d), ("1.1.1.1", 53), ("pypi.org", 443)]:\n'
            '    try:\n'
            '        socket.create_connection(addr, timeout=2); print("CONNECTED", addr)\n'
            '    except OSError as e:\n'
            '        print("blocked", addr, type(e).__name__)\n' % port)
  result = hostile_box.exec(['python', '-c', script])
  server.close()
  assert 'CONNECTED' not in result.text
  assert result.text.count('blocked') == 3, result.text


def _host_processes_with(marker):
  out = subprocess.run(['ps', '-eo', 'args'], capture_output=True, text=True).stdout
  return [line for line in out.splitlines() if marker in line]


def test_background_processes_do_not_survive(hostile_box):
  marker = f'{uuid.uuid4().int % 10**6 + 10**6}'
  result = hostile_box.run_shell(
      f'nohup sleep {marker} >/dev/null 2>&1 & setsid sleep {marker} & '
      f'(sleep {marker} &) ; echo started')
  assert 'started' in result.text
  time.sleep(0.2)
  assert _host_processes_with(f'sleep {marker}') == []


def test_sleep_forever_is_cut_off_at_the_deadline(hostile_box):
  start = time.monotonic()
  result = hostile_box.run_shell('sleep 100000', timeout_s=1.0)
  assert result.timed_out
  assert time.monotonic() - start < 5


def test_closing_output_does_not_escape_the_deadline(hostile_box):
  start = time.monotonic()
  result = hostile_box.run_shell('exec >&- 2>&-; sleep 100000', timeout_s=1.0)
  assert result.timed_out
  assert time.monotonic() - start < 5


def test_fork_bomb_is_contained(hostile_box):
  start = time.monotonic()
  result = hostile_box.exec(['bash', '-c', 'b() { b | b & }; b; sleep 2'], timeout_s=5)
  assert time.monotonic() - start < 15
  # Forks past the process limit are refused, and the command still ends on time.
  assert 'Resource temporarily unavailable' in result.text or result.timed_out
  # The host can still start processes and nothing of the bomb is left.
  assert subprocess.run(['true']).returncode == 0
  assert hostile_box.run_shell('echo alive').text == 'alive\n'


def test_memory_exhaustion_is_killed(hostile_box):
  result = hostile_box.exec(['python', '-c', 'x = bytearray(2 << 30); print("GOT IT")'])
  assert 'GOT IT' not in result.text
  assert result.exit_code != 0


def test_memory_limit_counts_all_processes_together(hostile_box):
  if not cgroups.CgroupSet.available():
    pytest.skip('no writable cgroups: memory is limited per process only (RLIMIT_AS).')
  # Four children of 100 MB each pass a per-process limit but not a 256 MB total.
  script = ('import subprocess, sys\n'
            'code = "import time; x = bytearray(100 << 20); x[::4096] = b\\"1\\" * '
            'len(x[::4096]); time.sleep(3)"\n'
            'ps = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(4)]\n'
            'print([p.wait() for p in ps])\n')
  result = hostile_box.exec(['python', '-c', script])
  assert '-9' in result.text, result.text


def test_cpu_quota_throttles_all_processes_together(repo):
  if not cgroups.CgroupSet.cpu_available():
    pytest.skip('no writable cpu cgroup: the CPU share is not bounded.')
  with bubblewrap.BubblewrapSandbox(repo, cpus=0.1) as box:
    env_testlib.spun_cpu_seconds(box, 0.1)


def test_output_flood_is_cut_off(hostile_box):
  start = time.monotonic()
  result = hostile_box.exec(['sh', '-c', 'yes flood'])
  assert result.truncated and not result.timed_out
  assert time.monotonic() - start < 8
  assert len(result.output) < (1 << 20) + 200
  assert b'bytes of output dropped' not in result.output[:100]


def test_large_files_are_refused(hostile_box):
  result = hostile_box.run_shell('head -c 300M /dev/zero > big.bin; echo $?')
  assert os.path.getsize(os.path.join(hostile_box.host_root, 'big.bin')) <= 256 << 20
  assert result.text.strip().splitlines()[-1] != '0'


def test_processes_run_without_privileges(hostile_box):
  result = hostile_box.run_shell('id -u; grep CapEff /proc/self/status; hostname')
  uid, caps, hostname = result.text.split('\n')[:3]
  assert uid == '1000'
  assert caps.split()[-1] == '0000000000000000'
  assert hostname == 'sandbox'


def test_concurrent_commands_do_not_see_each_other(repo):
  with bubblewrap.BubblewrapSandbox(repo) as a, bubblewrap.BubblewrapSandbox(repo) as b:
    results = {}
    threads = [threading.Thread(target=lambda n, s: results.__setitem__(
        n, s.run_shell('echo $$ > mine; sleep 0.5; ls /proc | grep -c "^[0-9]"; cat mine')),
        args=(name, box)) for name, box in (('a', a), ('b', b))]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    assert all(int(r.text.split()[0]) < 10 for r in results.values())
    assert a.read_file('mine') != b'' and b.read_file('mine') != b''


def test_rlimit_fallback_without_cgroups(hostile_box):
  # Where cgroups are not writable, rlimits bound each process instead.
  hostile_box._use_cgroups = False  # pylint: disable=protected-access
  result = hostile_box.exec(['python', '-c', 'x = bytearray(1 << 30); print("GOT IT")'])
  assert 'GOT IT' not in result.text and 'MemoryError' in result.text


# Reads every file under /proc it may, and every file a /proc link points to (an
# inherited descriptor, say), and prints which needle it found where. The needles come in
# a workspace file deleted once read, so they are in no command line or environment; a
# control needle in its own environment and one in a file it holds open prove the walk
# reaches both kinds of place.
_PROC_WALKER = r'''
import os, signal, stat

def alarm(*_):
  raise TimeoutError

with open('needles.txt', 'rb') as f:
  needles = f.read().split()
os.remove('needles.txt')
held = open('held.txt', 'rb')
signal.signal(signal.SIGALRM, alarm)
hits, scanned = set(), 0  # (needle, path)

def scan(path):
  global scanned
  try:
    if os.path.islink(path):
      hits.update((n, path) for n in needles if n in os.readlink(path).encode())
    if not stat.S_ISREG(os.stat(path).st_mode):
      return  # pipes and sockets (our own stdout among them) would block or loop
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
      with open(path, 'rb') as f:
        data = f.read(1 << 20)
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
  except (OSError, TimeoutError):
    return
  scanned += 1
  hits.update((n, path) for n in needles if n in data)

for dirpath, dirnames, filenames in os.walk('/proc'):
  for name in filenames + dirnames:
    scan(os.path.join(dirpath, name))
print('scanned', scanned)
for needle, path in sorted(hits):
  print('HIT', needle.decode(), path)
'''


def _proc_hits(box, needles, control_env, control_file) -> dict[str, list[str]]:
  '''{needle: paths under /proc where the walker read it} for a walk inside `box`.'''
  box.write_file('needles.txt', ' '.join(needles).encode())
  box.write_file('held.txt', control_file.encode())
  box.write_file('walker.py', _PROC_WALKER.encode())
  result = box.exec(['env', f'CONTROL={control_env}', 'python', 'walker.py'], timeout_s=60)
  assert result.exit_code == 0 and not result.timed_out, result.text
  scanned = int(result.text.split('scanned ')[1].split()[0])
  assert scanned > 200, result.text  # the walk really read /proc
  hits = {needle: [] for needle in needles}
  for line in result.text.splitlines():
    if line.startswith('HIT '):
      _, needle, path = line.split(' ', 2)
      hits[needle].append(path)
  return hits


@pytest.fixture
def host_canaries(monkeypatch, tmp_path):
  '''A secret in the launcher's environment and one in a file it holds open (inheritable,
  as a descriptor left by a shell redirect would be).'''
  env_canary, file_canary = (f'canary{uuid.uuid4().hex}' for _ in range(2))
  monkeypatch.setenv('C2JAX_TEST_API_KEY', env_canary)
  secret = tmp_path / 'credentials'
  secret.write_text(file_canary)
  fd = os.open(secret, os.O_RDONLY)
  os.set_inheritable(fd, True)
  yield env_canary, file_canary
  os.close(fd)


def _assert_nothing_of_the_host_leaks(box, host_canaries):
  control_env, control_file = (f'control{uuid.uuid4().hex}' for _ in range(2))
  hits = _proc_hits(box, [*host_canaries, control_env, control_file], control_env,
                    control_file)
  # The walk finds the controls, in its own environment and its own open descriptor...
  assert any(path.endswith('/environ') for path in hits[control_env]), hits
  assert any('/fd/' in path for path in hits[control_file]), hits
  # ...and the host's secrets nowhere.
  for canary in host_canaries:
    assert not hits[canary], f'{canary} is readable inside the sandbox at {hits[canary]}'


def test_host_environment_and_descriptors_are_unreadable(hostile_box, host_canaries):
  _assert_nothing_of_the_host_leaks(hostile_box, host_canaries)
  # The command's environment is exactly the documented one, and the sandbox's process 1
  # is the command itself: no launcher process shows its arguments or environment.
  env = dict(line.split('=', 1) for line in hostile_box.exec(['env']).text.splitlines())
  assert env == bubblewrap.environment(hostile_box.ro_binds)
  assert env.keys() == {'PATH', *sandbox_lib.BASE_ENVIRONMENT}
  cmdline = hostile_box.run_shell('tr "\\0" " " < /proc/1/cmdline').text
  assert cmdline.startswith('/bin/sh -c tr'), cmdline


def test_docker_backend_leaks_nothing_of_the_host(docker_engine, repo, host_canaries):
  name, engine_args, fake = docker_engine
  with sandbox_lib.make_sandbox('docker', repo, timeout_s=60, **engine_args) as box:
    if name == 'fake':
      create = [body for _, path, body in fake.requests if path == '/containers/create']
      env = create[-1]['Env']
    else:
      box._container.reload()  # pylint: disable=protected-access
      env = box._container.attrs['Config']['Env']  # pylint: disable=protected-access
    assert {f'{k}={v}' for k, v in sandbox_lib.BASE_ENVIRONMENT.items()} <= set(env)
    assert {item.split('=', 1)[0] for item in env} <= {'PATH', *sandbox_lib.BASE_ENVIRONMENT}
    _assert_nothing_of_the_host_leaks(box, host_canaries)
