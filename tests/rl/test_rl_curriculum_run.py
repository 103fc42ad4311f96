"""`c2jax rl` with the running curriculum at test size: the pool is fed draws, the
metrics carry the curriculum, and a rerun resumes its statistics from the checkpoint,
each trained group counted exactly once."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from c2jax.rl.tasks import curriculum
from c2jax.rl.queue.group_queue import GroupQueue
from c2jax.train import profiling

REPO = pathlib.Path(__file__).resolve().parents[2]


def _rl(workdir, data_cache, steps, *extra):
  command = [sys.executable, "-m", "c2jax.cli", "rl", "--config=configs/rl.py:test",
             f"--workdir={workdir}", f"--config.data.cache_dir={data_cache}",
             "--config.data.vocab_size=1024", "--config.data.max_total_bytes=3000000",
             "--config.data.tokenizer_train_bytes=300000", f"--config.learner.steps={steps}",
             "--config.rl.curriculum.sampling=running", "--config.rl.curriculum.lookahead=2",
             "--config.rl.curriculum.probe_samples=0", "--config.tasks.train_count=3", *extra]
  proc = subprocess.run(command, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
  return proc.stdout


def _curriculum_state(workdir, step):
  return json.loads((workdir / "checkpoints" / str(step) / "data" / "metadata").read_text())


@pytest.mark.slow
def test_running_curriculum_feeds_the_pool_and_resumes_from_the_checkpoint(tmp_path,
                                                                           data_cache):
  workdir = tmp_path / "run"
  # The first run also traces its steps: the learner's, and the actor's rollouts for them.
  first = _rl(workdir, data_cache, 2, "--config.profile.steps=(1, 2)")
  assert "statistics from the prior; 2 drawn" in first
  learner = profiling.span_totals(workdir / "profile" / "learner")
  assert {name: learner[name][0] for name in ("learner/wait", "learner/step",
                                              "learner/publish")} == {
      "learner/wait": 2, "learner/step": 2, "learner/publish": 2}
  assert learner["learner/checkpoint"][0] >= 1
  actor = profiling.span_totals(workdir / "profile" / "actor0")
  assert actor["actor/rollout"][0] >= 1 and actor["actor/weights"][0] >= 1
  second = _rl(workdir, data_cache, steps=3)  # resumes at step 2
  assert "resuming from step 2" in second and "statistics from the checkpoint" in second

  manifests = GroupQueue(workdir / "queue", capacity=1, max_lag=0).trained_steps()
  trained = [g for step in sorted(manifests) for g in manifests[step]]
  assert len(trained) == len(set(trained)) == 3
  prompts = [curriculum.prompt_of(g) for g in trained]  # every group is a draw
  stats = _curriculum_state(workdir, 3)["curriculum"]["stats"]
  assert {p: s["groups"] for p, s in stats.items()} == {p: prompts.count(p) for p in prompts}
  assert _curriculum_state(workdir, 2)["curriculum"]["stats"].keys() == set(prompts[:2])
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  steps = [row for row in rows if "loss" in row]
  assert [row["step"] for row in steps] == [1, 2, 3]
  for row in steps:
    assert 0 < row["curriculum/effective_prompts"] <= 3
    assert row["curriculum/trained_expected_pass_rate"] >= 0
    assert row["uniform_groups"] in (0.0, 1.0)
  # No draw is lost: every finished draw was trained, or waits in the queue for the next
  # run (an actor may finish one after the last step), or went stale.
  done = len(list((workdir / "pool" / "done").iterdir()))
  queued = GroupQueue(workdir / "queue", capacity=1, max_lag=0).counts()
  assert done == queued["trained"] + queued["ready"] + queued["stale"]
  # The pool stays fed: after the last top-up `lookahead` (2) draws were pending or
  # leased; a leased one was either finished (queued) or handed back to pending on stop.
  pending = len(list((workdir / "pool" / "pending").iterdir()))
  assert pending + queued["ready"] >= 2
  assert not list((workdir / "pool" / "leased").rglob("*.json"))
