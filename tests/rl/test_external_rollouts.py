"""RL actors rolling out through an external harness (agent.external.enabled): the
actor's engine served with capture, a group of scripted-harness episodes, queued as a
Group whose segments are exactly the captured tokens; a crashing harness drops the group."""

import os
import sys

import numpy as np
import pytest

from c2jax.data import tokenizer as tokenizer_lib
from c2jax.rl import job
from c2jax.rl.actors import actor
from c2jax.rl.actors import external_rollouts
from c2jax.rl.actors import infra
from c2jax.rl.actors import rollouts
from c2jax.serve import read_capture
from rl_testlib import flag_task_run
from tests.serve.conftest import ScriptedEngine

pytest.importorskip("openai")

FAKE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "agent",
                    "external", "external_fake_harness.py")


@pytest.fixture
def run(tmp_path):
  tokenizer = tokenizer_lib.train_bpe(["You fix bugs. Run the tests. Go on. Done?"] * 8, 300)
  cfg, task, dirs, pool, queue = flag_task_run(tmp_path)
  script = np.asarray(tokenizer.encode("Go on.")).tolist()
  engine = ScriptedEngine(script, num_slots=2, max_length=4096)
  capture = str(tmp_path / "capture.jsonl")

  def step(command):
    cfg.agent.external.update(enabled=True, harness="command", command=command,
                              timeout_s=120.0)
    groups = external_rollouts.ExternalGroups(
        engine, tokenizer, cfg.agent, vocab_size=tokenizer.vocab_size,
        capture_path=capture, actor_id="actor0", retries=cfg.rl.infra.retries)
    try:
      task_id, payload = pool.lease("actor0")
      return actor.roll_out_prompt(cfg, dirs, engine, tokenizer, pool, queue, "actor0",
                                   task_id, payload, external=groups)
    finally:
      groups.close()

  return dirs, pool, queue, capture, step


def test_an_external_group_is_queued_with_the_captured_tokens(run):
  dirs, pool, queue, capture, step = run
  assert step(f"{sys.executable} {FAKE} {{task_file}} pkg/flag.py=DONE_=_True") == "queued"
  assert pool.counts()["done"] == 1
  group = queue.get(learner_version=0, timeout=5)
  rows = read_capture(capture)
  assert len(rows) == 10  # 2 episodes x 5 requests
  assert len(group.segments) == 4  # each episode: 2 segments (its 3rd call restarts)
  assert list(group.segment_chain_S) == [0, 0, 1, 1]
  # Every segment is some request's whole prompt + completion, sampled tokens masked in.
  fulls = [np.concatenate([r["prompt_ids"], r["completion_ids"]]) for r in rows]
  for segment in group.segments:
    assert any(np.array_equal(segment["tokens"], full) for full in fulls)
    assert segment["loss_mask"].sum() > 0
    np.testing.assert_allclose(segment["sampler_logprobs"][segment["loss_mask"] > 0], -0.25)
  # Each episode's harness got its rollout seed (C2JAX_SEED), as native rollouts do.
  seeds = rollouts.rollout_seeds("flag", 2, job.job_defaults("tiny").learner.seed)
  sent = sorted({row["sampling"]["seed"] - (i % 5 + 1) for i, row in enumerate(
      sorted(rows, key=lambda r: (r["model"], r["created"])))})
  assert sent == sorted(seeds)
  assert group.info["solved"] == [True, True]  # the harness's edit passed the hidden test
  assert (group.rewards_G > 0.5).all()


def test_a_crashing_harness_drops_the_group_and_returns_the_prompt(run):
  dirs, pool, queue, _, step = run
  assert step(f"{sys.executable} -c 'raise SystemExit(3)'") == "dropped"
  assert sum(queue.counts().values()) == 0
  assert pool.counts() == {"pending": 1, "leased": 0, "done": 0}
  assert infra.totals(dirs)["infra_failures"] == 1
