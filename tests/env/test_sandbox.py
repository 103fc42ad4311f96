"""The Sandbox interface on the bubblewrap backend: exec, files, snapshot/fork/reset."""

import os

import pytest

from c2jax.env import bubblewrap, limits, sandbox as sandbox_lib, workspace


def test_exec_runs_in_workspace_with_output_and_status(box):
  result = box.run_shell('pwd; cat pkg/text.py; echo err >&2; exit 3')
  assert result.exit_code == 3
  assert result.text.splitlines()[0] == '/workspace'
  assert 'def shout' in result.text and 'err' in result.text
  assert not result.timed_out and not result.truncated


def test_stdin_reaches_the_command(box):
  assert box.exec(['cat'], stdin=b'piped').output == b'piped'


def test_tests_can_run_with_the_hosts_pytest(box):
  box.write_file('test_a.py', b'from pkg.mathx import add\n\ndef test_add():\n'
                 b'    assert add(2, 3) == 5\n')
  result = box.run_shell('PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q '
                         '-p no:cacheprovider test_a.py')
  assert result.exit_code == 0, result.text
  assert '1 passed' in result.text


def test_file_access_and_listing(box):
  box.write_file('new/dir/f.txt', b'data')
  assert box.read_file('new/dir/f.txt') == b'data'
  assert box.read_file('/workspace/new/dir/f.txt') == b'data'
  assert box.list_files() == ['README.md', 'new/dir/f.txt', 'pkg/__init__.py',
                              'pkg/mathx.py', 'pkg/text.py']
  with pytest.raises(FileNotFoundError):
    box.read_file('missing.txt')
  with pytest.raises(IsADirectoryError):
    box.read_file('pkg')


def test_writes_never_reach_the_repository(box, repo):
  box.run_shell('echo changed > README.md; rm pkg/text.py')
  assert box.read_file('README.md') == b'changed\n'
  with open(os.path.join(repo, 'README.md')) as f:
    assert f.read() == 'A tiny project.\n'
  assert os.path.exists(os.path.join(repo, 'pkg/text.py'))


@pytest.mark.parametrize('strategy', ['overlay', 'copy'])
def test_fork_snapshot_and_reset(repo, strategy):
  if strategy == 'overlay' and not workspace.overlay_supported():
    pytest.skip('overlayfs cannot be mounted by this user; the copy strategy is used.')
  with bubblewrap.BubblewrapSandbox(repo, workspace=strategy) as parent:
    parent.run_shell('echo one > state.txt; rm README.md')
    child = parent.fork()
    parent.write_file('state.txt', b'two\n')
    # The fork saw the parent's state at fork time, and diverges afterwards.
    assert child.read_file('state.txt') == b'one\n'
    assert 'README.md' not in child.list_files()
    child.run_shell('echo child > only_child.txt')
    assert 'only_child.txt' not in parent.list_files()
    grandchild = child.fork()
    parent.close()  # forks outlive the parent
    assert grandchild.run_shell('cat state.txt only_child.txt').text == 'one\nchild\n'
    child.reset()  # a fork resets to the moment it was forked
    assert child.list_files() == ['pkg/__init__.py', 'pkg/mathx.py', 'pkg/text.py',
                                  'state.txt']
    grandchild.reset()
    assert grandchild.read_file('only_child.txt') == b'child\n'
    scratch = child._workspace.family.root  # pylint: disable=protected-access
    child.close()
    assert os.path.isdir(scratch)  # the grandchild still uses the family's layers
    grandchild.close()
    assert not os.path.exists(scratch)


def test_closed_sandbox_refuses_work_and_cleans_up(repo):
  box = bubblewrap.BubblewrapSandbox(repo)
  root = box.host_root
  box.close()
  box.close()  # idempotent
  assert not os.path.exists(root)
  with pytest.raises(RuntimeError, match='closed'):
    box.run_shell('true')


def test_make_sandbox_registry_and_limit_errors(repo):
  assert sandbox_lib.backends() == ['bubblewrap', 'docker']
  with pytest.raises(ValueError, match="Unknown sandbox backend 'firecracker'"):
    sandbox_lib.make_sandbox('firecracker', repo)
  with pytest.raises(TypeError, match=r"Unknown sandbox limit\(s\) \['memroy_mb'\]"):
    sandbox_lib.make_sandbox('bubblewrap', repo, memroy_mb=5)
  with pytest.raises(ValueError, match='timeout_s=-1 must be a positive number'):
    limits.Limits(timeout_s=-1)
  with pytest.raises(FileNotFoundError, match='does not exist'):
    sandbox_lib.make_sandbox('bubblewrap', os.path.join(repo, 'nope'))


@pytest.mark.parametrize('path', ['../x', '/etc/passwd', 'a/../../x', '', 'a\0b'])
def test_relative_paths_must_stay_inside(path):
  with pytest.raises(sandbox_lib.PathOutsideWorkspaceError):
    sandbox_lib.normalize_relpath(path)


def test_output_keeper_keeps_head_and_tail():
  keeper = bubblewrap._OutputKeeper(10)
  for chunk in (b'abcde', b'fghij', b'klmno', b'pqrst'):
    keeper.add(chunk)
  assert keeper.value() == b'abcde\n[... 10 bytes of output dropped ...]\npqrst'
