"""`c2jax agent step`: one model turn on stdin, one JSON observation per call out."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def agent_cli(turn: bytes, *args):
  return subprocess.run([sys.executable, '-m', 'c2jax.commands.agent', *args],
                        input=turn, capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.fixture
def repo(tmp_path):
  (tmp_path / 'app.py').write_text('def main():\n    return 1\n')
  return str(tmp_path)


def test_step_runs_each_call_and_prints_observations(repo):
  turn = (b'Let me check.\n'
          b'<tool_call>{"name": "edit_file", "arguments": {"path": "app.py", '
          b'"old_string": "return 1", "new_string": "return 2"}}</tool_call>'
          b'<tool_call>{"name": "run_shell", "arguments": {"command": '
          b'"python -c \\"import app; print(app.main())\\""}}</tool_call>')
  result = agent_cli(turn, 'step', '--repo', repo)
  assert result.returncode == 0, result.stderr
  observations = [json.loads(line) for line in result.stdout.splitlines()]
  assert [(o['index'], o['name'], o['ok']) for o in observations] == [
      (0, 'edit_file', True), (1, 'run_shell', True)]
  assert observations[1]['output'] == 'exit code: 0\n2\n'
  with open(os.path.join(repo, 'app.py')) as f:
    assert 'return 1' in f.read()  # the repository itself is never changed


def test_step_reports_malformed_calls_and_exits_1(repo):
  turn = (b'\xff<tool_call>{"name": "read_file", "arguments": {"path": "../x"}}</tool_call>'
          b'<tool_call>{"name": "run_shell"}</tool_call><tool_call>not json</tool_call>')
  result = agent_cli(turn, 'step', '--repo', repo, '--tools', 'read_file,finish')
  assert result.returncode == 1
  outputs = [json.loads(line)['output'] for line in result.stdout.splitlines()]
  assert 'not valid UTF-8' in outputs[0]
  assert 'leaves the workspace' in outputs[1]
  assert "Unknown tool 'run_shell'; available tools: read_file, finish" in outputs[2]
  assert 'not valid JSON' in outputs[3]


def test_step_usage_errors(repo):
  result = agent_cli(b'', 'walk', '--repo', repo)
  assert result.returncode == 2 and b'expected the sub-command "step"' in result.stderr
  result = agent_cli(b'', 'step')
  assert result.returncode == 2 and b'--repo is required' in result.stderr
