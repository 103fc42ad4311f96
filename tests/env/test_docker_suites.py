"""`c2jax eval` and `c2jax rl` end to end with `agent.backend=docker` on a real engine:
every task's tools and hidden tests run in containers of the sandbox image."""

import datetime
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _sandbox_containers_since(client, since):
  """Names of the sandbox containers the engine created since `since` (a datetime)."""
  events = client.events(since=since, until=datetime.datetime.now(datetime.timezone.utc),
                         filters={'type': 'container', 'event': 'create'}, decode=True)
  names = [e['Actor']['Attributes'].get('name', '') for e in events]
  return [n for n in names if n.startswith('c2jax-')]


def _run(args, timeout):
  # The suite's XLA cache (tests/conftest.py) stays on: `c2jax rl` here compiles the same
  # programs as the other configs/rl.py:test runs, and the engine is what this file tests.
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-m', 'c2jax.cli', *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout, check=False)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
  return proc


def test_eval_oracle_on_procgen_in_docker(real_docker, tmp_path):
  since = datetime.datetime.now(datetime.timezone.utc)
  _run(['eval', '--config=configs/eval.py:procgen', f'--workdir={tmp_path / "run"}',
        '--config.agent.backend=docker', '--config.suite.args.count=2',
        '--config.eval.samples=1', '--config.eval.ks=(1,)', '--config.policy.concurrency=2',
        '--config.eval.progress=false'], timeout=400)
  summary = json.loads((tmp_path / 'run' / 'summary.json').read_text())
  assert summary['overall']['accuracy'] == 1.0 and summary['overall']['infra_errors'] == 0
  assert len(_sandbox_containers_since(real_docker, since)) >= 2  # one sandbox per task at least


@pytest.mark.slow  # trains a tokenizer and compiles the tiny RL step
def test_rl_in_docker(real_docker, tmp_path, data_cache):
  since = datetime.datetime.now(datetime.timezone.utc)
  workdir = tmp_path / 'run'
  _run(['rl', '--config=configs/rl.py:test', f'--workdir={workdir}',
        f'--config.data.cache_dir={data_cache}', '--config.data.vocab_size=1024',
        '--config.data.max_total_bytes=3000000', '--config.data.tokenizer_train_bytes=300000',
        '--config.learner.steps=1', '--config.tasks.train_count=1',
        '--config.agent.backend=docker'], timeout=900)
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert [row['step'] for row in rows if 'loss' in row] == [1]
  # A step of one group of two rollouts, then the held-out eval: all in containers.
  assert len(_sandbox_containers_since(real_docker, since)) >= 3
