"""The disk quota of a sandbox (Limits.disk_mb): writes past it fail inside with ENOSPC
(EDQUOT on docker's btrfs storage), and what the sandbox holds on the host's disk is
the quota (measured on the sandbox's own files, not the host's free space, which other
processes change)."""

import os
import subprocess
import sys

import pytest

from c2jax.env import bubblewrap, sandbox as sandbox_lib, workspace as workspace_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
QUOTA_MB = 32
# Ten 100 MB files: a gigabyte on the host's disk without a quota.
FILL = ('for i in 0 1 2 3 4 5 6 7 8 9; do head -c 100M /dev/zero > fill$i || echo FAIL$i; '
        'done; echo done')
FULL_MESSAGES = ('No space left on device', 'Disk quota exceeded')


def _allocated_bytes(folder):
  """Bytes of the host's disk under `folder`, not counting mounted file systems (the
  workspace's volume is counted once, as its image file)."""
  total = 0
  for dirpath, dirnames, filenames in os.walk(folder):
    dirnames[:] = [d for d in dirnames if not os.path.ismount(os.path.join(dirpath, d))]
    for name in filenames:
      try:
        total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
      except FileNotFoundError:
        pass
  return total


@pytest.mark.parametrize('strategy', ['overlay', 'copy'])
def test_bubblewrap_writes_past_the_quota_fail_and_the_host_keeps_its_space(repo, strategy):
  if not workspace_lib.quota_supported():
    pytest.skip('this process cannot mount a file system (not root): the quota is not '
                'enforced; test_without_the_right_to_mount_only_tmp_is_bounded covers that.')
  if strategy == 'overlay' and not workspace_lib.overlay_supported():
    pytest.skip('overlayfs cannot be mounted here.')
  with bubblewrap.BubblewrapSandbox(repo, workspace=strategy, disk_mb=QUOTA_MB,
                                    timeout_s=60) as box:
    assert box.disk_quota_enforced
    scratch = box._workspace.family.root  # pylint: disable=protected-access
    result = box.run_shell(FILL)
    assert 'No space left on device' in result.text and 'FAIL9' in result.text, result.text
    written = sum(len(box.read_file(f'fill{i}')) for i in range(10))
    assert (QUOTA_MB - 4) << 20 <= written <= QUOTA_MB << 20
    # What the workspace holds on the host is at most the quota (its sparse image file).
    assert _allocated_bytes(scratch) <= (QUOTA_MB + 4) << 20
    # /tmp is bounded the same way; the workspace still reads and, once freed, writes.
    result = box.run_shell('(cd /tmp && head -c 100M /dev/zero > big); echo $?; rm fill*; '
                           'python -c "open(\'ok\', \'w\').write(\'x\')" && cat ok')
    assert 'No space left on device' in result.text and result.text.endswith('1\nx'), result.text
    box.reset()
    assert box.run_shell('head -c 8M /dev/zero > small && echo ok').text == 'ok\n'
  assert not os.path.exists(scratch)


def test_without_the_right_to_mount_only_tmp_is_bounded(repo, monkeypatch, caplog):
  monkeypatch.setattr(workspace_lib, 'quota_supported', lambda: False)
  monkeypatch.setattr(bubblewrap, '_warned_no_quota', False)
  with bubblewrap.BubblewrapSandbox(repo, disk_mb=QUOTA_MB) as box:
    assert not box.disk_quota_enforced
    assert 'disk quota not enforced' in caplog.text and 'needs root' in caplog.text
    result = box.run_shell('(cd /tmp && head -c 40M /dev/zero > big); echo $?; '
                           'head -c 40M /dev/zero > big; echo $?')
    assert 'No space left on device' in result.text and result.text.endswith('1\n0\n')


def test_sandbox_exec_disk_flag(repo):
  if not workspace_lib.quota_supported():
    pytest.skip('this process cannot mount a file system (not root).')
  result = subprocess.run(
      [sys.executable, '-m', 'c2jax.commands.sandbox', 'exec', '--repo', repo, '--disk',
       str(QUOTA_MB), '--', 'sh', '-c', FILL], capture_output=True,
      env=dict(os.environ, PYTHONPATH=ROOT), check=False)
  assert result.returncode == 0, result.stderr
  assert b'No space left on device' in result.stdout and b'FAIL9' in result.stdout


def test_docker_writes_past_the_quota_fail_and_the_host_keeps_its_space(real_docker, repo):
  # (The fake engine records the size but cannot enforce it.)
  with sandbox_lib.make_sandbox('docker', repo, disk_mb=QUOTA_MB, timeout_s=60) as box:
    if not box.disk_quota_enforced:
      pytest.skip('this engine cannot enforce a size (see docker_backend.py).')
    result = box.run_shell('head -c 16M /dev/zero > half && echo wrote half; ' + FILL)
    assert 'wrote half' in result.text, result.text
    assert any(m in result.text for m in FULL_MESSAGES) and 'FAIL9' in result.text, result.text
    # What the container's writable layer holds on the host's disk: the quota, not the
    # gigabyte (the host's free space would also count other processes' writes).
    container = box._container.id  # pylint: disable=protected-access
    (listed,) = real_docker.api.containers(all=True, size=True, filters={'id': container})
    written = listed['SizeRw']
    assert 16 << 20 <= written <= (QUOTA_MB + 4) << 20, written
    assert box.run_shell('cd /tmp && head -c 100M /dev/zero > big').exit_code != 0
