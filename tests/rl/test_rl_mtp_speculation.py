"""`c2jax rl` with speculative actors: the policy's MTP heads draft, the learner trains
them online and publishes them with the weights, and every step logs the acceptance."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from c2jax.model import mtp
from c2jax.rl import leader
from c2jax.rollout import weights as weights_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 2


def test_draft_metrics_pool_the_groups_counts():
  info = [{"verify_steps": 10, "accepted_drafts": 6, "draft_tokens": 2},
          {"verify_steps": 30, "accepted_drafts": 2, "draft_tokens": 2},
          {"solved": [True]}]  # a group rolled out without speculation
  metrics = leader.draft_metrics(info)
  assert metrics == {"draft_tokens_per_step": 1.0 + 8 / 40, "draft_acceptance": 8 / 80}
  assert leader.draft_metrics([{"solved": [True]}]) == {}


@pytest.mark.slow
def test_rl_with_speculative_actors_logs_acceptance_and_publishes_trained_heads(tmp_path):
  workdir = tmp_path / "run"
  # `c2jax rl` in a child process (it starts its own actor processes), its config built
  # here: a data list cannot be overridden on the command line.
  script = f"""
from c2jax import compile_cache, config as configlib
from c2jax.rl import trainer
compile_cache.enable()  # as `c2jax rl` does: the suite's XLA cache (tests/conftest.py)
cfg = configlib.load_config_file("configs/rl.py", "test")
cfg.data.update(cache_dir={str(tmp_path / "data")!r}, vocab_size=1024,
                max_total_bytes=1_000_000, tokenizer_train_bytes=300_000,
                # The standard library alone: a corpus that does not depend on what else
                # is installed (site-packages can leave the held-out split empty).
                sources=["stdlib"], heldout_fraction=0.3)
cfg.model.num_mtp_layers = 1
cfg.actors.num_draft_tokens = 2
cfg.actors.full_every = 100  # keep every published version (no snapshot deletes v0)
cfg.learner.steps = {STEPS}
cfg.learner.learning_rate = 1e-3
trainer.train(cfg, {str(workdir)!r})
"""
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=1800, check=False)
  assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  steps = [row for row in rows if "loss" in row]
  assert [row["step"] for row in steps] == list(range(1, STEPS + 1))
  for row in steps:
    assert 1.0 <= row["draft_tokens_per_step"] <= 3.0, row
    assert 0.0 <= row["draft_acceptance"] <= 1.0, row
    assert row["draft_tokens_per_step"] == pytest.approx(1.0 + 2 * row["draft_acceptance"])
    assert row["mtp0/kl"] > 0 and row["mtp_grad_norm"] > 0, row
  # The actor drafted (its groups carried counts) with the published heads, and each
  # step's publish carries heads trained by that step.
  [weights_dir] = list((workdir / "weights").iterdir())
  subscriber = weights_lib.WeightSubscriber(weights_dir)
  first = jax.tree.map(np.array, subscriber.load(0))  # copies: the cache is reused
  last = subscriber.load(STEPS)
  moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(first[mtp.PARAMS_KEY]),
                                                     jax.tree.leaves(last[mtp.PARAMS_KEY]))]
  assert any(moved)
