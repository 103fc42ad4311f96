"""`actors.backend = 'ray'` with an actor of two JAX processes (config.actors.processes = 2,
one CPU device each, the engine mesh expert=2 spanning both) on a Ray cluster of two
nodes with one CPU each (tests/ray_testlib.py): the actor is two Ray tasks, one on each
node, forming one jax.distributed job whose coordinator process 0 names through the hub.
Killing the follower's Ray worker mid-rollout restarts the actor whole, as a new job; its
leased prompt goes back to the pool, no group is lost or trained twice, and the
two-process engine's log-probs of an on-policy group are the learner's (mismatch_p99).
(The process backend's: tests/rl/test_rl_actor_processes.py.)"""

import json
import os
import pathlib
import re
import signal
import threading
import time

import pytest

ray = pytest.importorskip(
    "ray", reason="the Ray backend test needs Ray: pip install 'c2jax[ray]' (in .[test])")

from tests import ray_testlib  # pylint: disable=g-import-not-at-top
from tests.rl.test_ray_backend import (STEPS, ray_config, train_during,  # pylint: disable=g-import-not-at-top
                                      trained_once)


def _actor_process(rank: int) -> list[int]:
  """Pids of the Ray workers running process `rank` of a multi-process actor (the Ray
  backend starts them with C2JAX_ACTOR_PROCESS=rank)."""
  want = f"C2JAX_ACTOR_PROCESS={rank}".encode()
  pids = []
  for proc in pathlib.Path("/proc").iterdir():
    try:
      if want in (proc / "environ").read_bytes().split(b"\0"):
        pids.append(int(proc.name))
    except (OSError, ValueError):
      continue
  return pids


def _kill_the_follower_mid_rollout(workdir: pathlib.Path, killed: list, stop: threading.Event):
  """SIGKILLs process 1's worker once both processes run and the actor holds a lease."""
  leased = workdir / "pool" / "leased"
  while not stop.is_set():
    followers, leaders = _actor_process(1), _actor_process(0)
    if followers and leaders and leased.exists() and list(leased.glob("*/*.json")):
      os.kill(followers[0], signal.SIGKILL)
      killed.append(followers[0])
      return
    time.sleep(0.1)


@pytest.mark.slow
def test_a_two_process_ray_actor_spans_two_nodes_and_restarts_whole(tmp_path, data_cache,
                                                                    monkeypatch,
                                                                    capsys):
  cfg = ray_config(data_cache)
  cfg.actors.count = 1
  cfg.actors.processes = 2
  cfg.actors.parallel.mesh.expert = 2
  cfg.actors.weights_dir = f"file://{tmp_path / 'bucket'}/weights"
  workdir = tmp_path / "run"

  with ray_testlib.two_nodes(monkeypatch, head_cpus=1, node_cpus=1):
    summary, killed = train_during(cfg, workdir, _kill_the_follower_mid_rollout)

  assert summary["step"] == STEPS
  output = capsys.readouterr().out
  assert killed, "the follower never ran while the actor held a lease"
  assert re.search(r"actor0 died \(status 1\)( on node \S+)? \(process 1 of 2 ended "
                   r"first\); .*restart 1/", output), output[-3000:]
  trained_once(workdir, cfg)
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [row["step"] for row in rows if "loss" in row] == list(range(1, STEPS + 1))
  # Step 1 trains a group sampled by version 0, the weights the learner steps from: the
  # gap between the two-process engine's log-probs and the learner's is numerics alone.
  first = next(row for row in rows if row["step"] == 1 and "loss" in row)
  assert first["staleness_tokens"] == 0.0, first
  assert first["mismatch_p99"] < 1e-5, first
