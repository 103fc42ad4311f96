"""Containment on a real Docker engine: what a hostile command tries must fail or be cut
off, by the engine's own limits. (Against the fake engine, whose containers are
bubblewrap sandboxes, test_containment.py covers the same ground.)"""

import os
import re
import socket
import time

import pytest

from c2jax.env import sandbox as sandbox_lib
import env_testlib


@pytest.fixture(scope='module')
def real_box(real_docker, tmp_path_factory):
  repo = tmp_path_factory.mktemp('repo')
  (repo / 'README.md').write_text('hostile\n')
  with sandbox_lib.make_sandbox('docker', str(repo), timeout_s=20, memory_mb=256,
                                max_processes=64) as box:
    yield box


def test_network_is_off_even_the_hosts_loopback(real_box):
  server = socket.socket()
  server.bind(('0.0.0.0', 0))
  server.listen(1)
  port = server.getsockname()[1]
  script = ('import socket\n'
            'print(sorted(n for _, n in socket.if_nameindex()))\n'
            'for addr in [("127.0.0.1", %d), ("172.17.0.1", %d), ("1.1.1.1", 53), '
            '("deb.debian.org", 80)]:\n'
            '    try:\n'
            '        socket.create_connection(addr, timeout=2); print("CONNECTED", addr)\n'
            '    except OSError as e:\n'
            '        print("blocked", addr, type(e).__name__)\n' % (port, port))
  result = real_box.exec(['python', '-c', script])
  server.close()
  assert result.text.startswith("['lo']"), result.text  # no interface but loopback
  assert 'CONNECTED' not in result.text and result.text.count('blocked') == 4, result.text


def test_host_files_are_invisible_and_the_command_has_no_capabilities(real_box):
  result = real_box.run_shell(
      f'ls {os.path.dirname(os.path.abspath(__file__))} /work /root 2>&1; '
      'grep CapEff /proc/self/status; python -c "import ctypes; libc = ctypes.CDLL(None, '
      'use_errno=True); print(\'mount\', libc.mount(b\'none\', b\'/mnt\', b\'tmpfs\', 0, '
      'None), ctypes.get_errno())"; echo done')
  assert 'No such file or directory' in result.text
  assert 'test_docker_containment.py' not in result.text
  assert 'CapEff:\t0000000000000000' in result.text
  assert 'mount -1 1\n' in result.text, result.text  # EPERM
  assert result.text.rstrip().endswith('done')


def test_memory_limit_counts_all_processes_together(real_box):
  # Four children of 100 MB each pass a per-process limit but not a 256 MB total.
  script = ('import subprocess, sys\n'
            'code = "import time; x = bytearray(100 << 20); x[::4096] = b\\"1\\" * '
            'len(x[::4096]); time.sleep(3)"\n'
            'ps = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(4)]\n'
            'print([p.wait() for p in ps])\n')
  result = real_box.exec(['python', '-c', script])
  assert '-9' in result.text, result.text
  assert real_box.run_shell('echo alive').text == 'alive\n'


def test_fork_bomb_is_contained_by_the_pids_limit(real_box):
  start = time.monotonic()
  result = real_box.exec(['sh', '-c', 'b() { b | b & }; b; sleep 2'], timeout_s=5)
  assert time.monotonic() - start < 20
  assert 'fork' in result.text.lower() or 'resource' in result.text.lower() or result.timed_out
  # The bomb is gone: left are init and its sleep, and this command's sh, timeout, ps.
  ps = real_box.exec(['ps', '-e', '--no-headers', '-o', 'comm']).text.split()
  assert sorted(ps) == ['ps', 'sh', 'sh', 'sleep', 'timeout'], ps
  assert real_box.run_shell('echo alive').text == 'alive\n'


def test_large_files_are_refused(real_box):
  # head's error goes to a file and is printed after: docker exec carries stderr apart
  # from stdout, so their order in the text is not the order they were written in.
  result = real_box.run_shell('head -c 300M /dev/zero > big.bin 2> head.err; '
                              'echo "exit=$? bytes=$(stat -c %s big.bin)"; cat head.err')
  found = re.search(r'exit=(\d+) bytes=(\d+)', result.text)
  assert found, result.text
  code, size = found.groups()
  assert code != '0' and int(size) <= 256 << 20, result.text


def test_cpu_quota_throttles_all_processes_together(real_docker, repo):
  with sandbox_lib.make_sandbox('docker', repo, cpus=0.1) as box:
    env_testlib.spun_cpu_seconds(box, 0.1)
