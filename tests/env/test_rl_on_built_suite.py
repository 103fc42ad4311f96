"""`c2jax rl` on a suite built by `c2jax tasks build` from an auto-installed package:
rollouts run in sandboxes that start from the package's environment layer, hidden tests
grade, and the learner trains 2 steps."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from c2jax.env import task_builder
from c2jax.env.install import InstallConfig, install
from c2jax.rl.tasks import task_sources
from env_testlib import calc_repo

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope='module')
def suite(tmp_path_factory):
  root = tmp_path_factory.mktemp('suite')
  result = install(calc_repo(root / 'calcrl', 'calcrl', []),
                   InstallConfig(cache_dir=str(root / 'envs')))
  assert result.ok, result.report()
  path = str(root / 'suite.jsonl')
  records = task_builder.build_suite(result, path, max_tasks=4, max_candidates=16)
  assert len(records) >= 3
  return path


@pytest.mark.slow
def test_task_source_split_and_errors(suite):
  cfg = type('Cfg', (), dict(source='suite', path=suite, repos_root='', seed=0,
                             heldout_count=1, train_count=2))
  train, heldout = task_sources.load_split(cfg, train_needed=2)
  assert len(train) == 2 and len(heldout) == 1
  assert not {t.id for t in train} & {t.id for t in heldout}
  assert all(t.environment for t in train + heldout)
  with pytest.raises(ValueError, match='learner.steps'):
    task_sources.load_split(cfg, train_needed=10)


@pytest.mark.slow
def test_rl_two_steps_on_a_built_suite(suite, tmp_path, data_cache):
  workdir = tmp_path / 'run'
  command = [sys.executable, '-m', 'c2jax.cli', 'rl', '--config=configs/rl.py:test',
             f'--workdir={workdir}', f'--config.data.cache_dir={data_cache}',
             '--config.data.vocab_size=1024', '--config.data.max_total_bytes=4000000',
             '--config.data.tokenizer_train_bytes=300000', '--config.learner.steps=2',
             '--config.tasks.source=suite', f'--config.tasks.path={suite}',
             '--config.tasks.train_count=2', '--config.tasks.heldout_count=1']
  proc = subprocess.run(command, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS='cpu'),
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert [row['step'] for row in rows if 'loss' in row] == [1, 2]
  trained = {p.name for p in (workdir / 'pool' / 'done').iterdir()}
  assert len(trained) == 2 and all('.mutate.' in t or '.revert.' in t for t in trained)


def test_file_sources_need_a_path():
  from c2jax import config as configlib
  from c2jax.rl import job
  cfg = job.job_defaults()
  cfg.tasks.source = 'suite'
  with pytest.raises(configlib.ConfigError, match='tasks.path'):
    job.validate(cfg)
  cfg.tasks.source, cfg.tasks.path = 'swebench', '/'
  with pytest.raises(configlib.ConfigError, match='tasks.repos_root'):
    job.validate(cfg)
  cfg.tasks.source = 'nonsense'
  with pytest.raises(configlib.ConfigError, match='tasks.source'):
    job.validate(cfg)
