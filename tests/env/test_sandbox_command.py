"""`c2jax sandbox exec` through `python -m c2jax.commands.sandbox`."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def sandbox_cli(*args):
  return subprocess.run([sys.executable, '-m', 'c2jax.commands.sandbox', *args],
                        capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT))


def test_exec_prints_output_and_exits_with_the_commands_status(repo):
  result = sandbox_cli('exec', '--repo', repo, '--', 'sh', '-c',
                       'cat pkg/text.py; echo oops >&2; touch new; exit 7')
  assert result.returncode == 7
  assert b'def shout' in result.stdout and b'oops' in result.stdout
  assert b'exit status: 7' in result.stderr
  assert not os.path.exists(os.path.join(repo, 'new'))


def test_timeout_exits_124(repo):
  result = sandbox_cli('exec', '--repo', repo, '--timeout', '1', '--', 'sleep', '30')
  assert result.returncode == 124
  assert b'(timed out)' in result.stderr


def test_memory_flag_limits_the_command(repo):
  result = sandbox_cli('exec', '--repo', repo, '--memory', '64', '--', 'python', '-c',
                       'x = bytearray(200 << 20); print("GOT IT")')
  assert result.returncode != 0 and b'GOT IT' not in result.stdout


def test_usage_errors(repo):
  for args, message in [((), b'expected the sub-command "exec"'),
                        (('exec', '--repo', repo), b'no command given'),
                        (('exec', '--', 'ls'), b'--repo is required')]:
    result = sandbox_cli(*args)
    assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
