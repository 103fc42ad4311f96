"""Preemption and resume of a 2-process jax.distributed pretraining run (2 CPU processes x
2 fake devices): SIGTERM to one process at a random step stops both after the same step
with one checkpoint and exit status 0, and rerunning both continues the uninterrupted
run's losses exactly. And resuming onto another process count and mesh: the 2-process
run's checkpoint continues on 1 process with fsdp=2, expert=2, and a 1-process run of two
data streams continues on 2 processes, each with the losses of the uninterrupted
2-process run; a run of one stream is refused on 2 processes before anything compiles."""

import random
import shutil
import signal

import numpy as np
import pytest

from distributed_testlib import ARGS, PRETRAIN, STEPS, finish, start_pair
from train_testlib import losses, run_job, signal_at_step, summary

pytestmark = pytest.mark.slow  # each run starts two JAX processes


def test_sigterm_to_one_process_stops_both_at_one_step_and_resumes_exactly(
    tmp_path, data_cache, two_process_reference):
  reference = two_process_reference
  workdir = tmp_path / "preempted"
  pair = start_pair(workdir, data_cache)
  at_step = random.randint(1, 4)
  results = signal_at_step(pair, workdir, at_step, signal.SIGTERM, to=[pair[1]],
                           timeout_s=600)
  for rank, (code, _, err) in enumerate(results):
    assert code == 0, f"process {rank}, signalled at step {at_step}:\n{err[-3000:]}"
  stopped = [summary(out)["preempted"] for _, out, _ in results]
  # JAX's preemption sync point: both stop after the same step, after the signal.
  assert stopped[0] == stopped[1] and at_step < stopped[0] < STEPS, (at_step, stopped)
  assert (workdir / "checkpoints" / str(stopped[0])).is_dir()
  resumed = finish(start_pair(workdir, data_cache))
  assert all(f"resume: step {stopped[0]}" in out for _, out, _ in resumed)
  assert losses(workdir) == losses(reference)
  assert losses(workdir / "process_1") == losses(reference / "process_1")


def _from_step(source, step, workdir):
  """workdir holding only `source`'s checkpoint of `step`, as a resume finds it."""
  shutil.copytree(source / "checkpoints" / str(step), workdir / "checkpoints" / str(step))
  return workdir


def _assert_continues(workdir, reference, first, last=STEPS):
  got, want = losses(workdir), losses(reference)
  assert sorted(got) == list(range(first, last + 1)), sorted(got)
  # Another mesh sums in another order: float32 rounding, not other data.
  np.testing.assert_allclose([got[s] for s in sorted(got)],
                             [want[s] for s in sorted(got)], rtol=2e-5)


def test_a_two_process_checkpoint_resumes_on_one_process_and_another_mesh(
    tmp_path, data_cache, two_process_reference):
  reference = two_process_reference
  workdir = _from_step(reference, 10, tmp_path / "one")
  result = run_job("pretrain", PRETRAIN, workdir, data_cache, *ARGS,
                   "--config.parallel.mesh.fsdp=2", "--config.parallel.mesh.expert=2",
                   devices=4)
  assert "resume: step 10" in result.stdout
  assert "(2 data streams, this process reads [0, 1])" in result.stdout
  _assert_continues(workdir, reference, 11)


def test_a_one_process_run_of_two_streams_resumes_on_two_processes(
    tmp_path, data_cache, two_process_reference):
  reference = two_process_reference
  # Two data streams from the start: one process reads both, as the 2-process run did.
  first = tmp_path / "first"
  run_job("pretrain", PRETRAIN, first, data_cache, *ARGS, "--config.train.steps=10",
          "--config.train.data_streams=2", devices=4)
  _assert_continues(first, reference, 1, 10)
  workdir = _from_step(first, 10, tmp_path / "two")
  resumed = finish(start_pair(workdir, data_cache))
  for rank, (_, out, _) in enumerate(resumed):
    assert f"resume: step 10 from {workdir}/checkpoints (2 data streams, this process " \
           f"reads [{rank}])" in out
  _assert_continues(workdir, reference, 11)


def test_a_run_of_one_stream_is_refused_on_two_processes_before_compiling(
    tmp_path, data_cache):
  workdir = tmp_path / "one_stream"
  run_job("pretrain", PRETRAIN, workdir, data_cache, *ARGS, "--config.train.steps=1",
          "--config.train.checkpoint_every=1", devices=2)
  pair = start_pair(workdir, data_cache)
  for rank, proc in enumerate(pair):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0, (rank, out)
    assert ("train.data_streams: the run in" in err and "started with 1 data streams, and "
            "2 processes cannot each read whole streams (1 % 2 != 0)" in err), err[-3000:]
    assert "step " not in out and "resume:" not in out
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1"]


def _conversations(path, count=48):
  """Short chats (no tool calls): enough rows for 4 SFT steps of 4 rows."""
  import json  # pylint: disable=import-outside-toplevel
  with open(path, "w") as out:
    for i in range(count):
      out.write(json.dumps({"messages": [
          {"role": "user", "content": f"What is {i} plus {i + 1}? Say it in words."},
          {"role": "assistant", "content": f"{i} plus {i + 1} is {2 * i + 1}; "
                                           + "counting on " * (1 + i % 5) + "done."}]})
                + "\n")
  return path


SFT = "configs/sft.py:tiny"


def test_an_sft_checkpoint_of_two_streams_resumes_on_two_processes(tmp_path, data_cache):
  """SFT reads its conversations through the same data streams: a 1-process run of two
  streams (two fake devices) checkpointed at step 2 continues on two processes, each
  reading one stream, with the uninterrupted run's losses."""
  chats = _conversations(tmp_path / "chats.jsonl")
  overrides = ("--config.init_from=", f"--config.sft.train_path={chats}",
               "--config.sft.heldout_path=", "--config.train.steps=4",
               "--config.train.seq_len=64", "--config.train.batch_size=4",
               "--config.train.checkpoint_every=2", "--config.train.data_streams=2",
               *ARGS[2:])  # no evals, the one-MoE-layer model
  reference = tmp_path / "whole"
  run_job("sft", SFT, reference, data_cache, *overrides, devices=2)
  workdir = _from_step(reference, 2, tmp_path / "two")
  resumed = finish(start_pair(workdir, data_cache, *overrides, verb="sft", config=SFT))
  for rank, (_, out, _) in enumerate(resumed):
    assert f"(2 data streams, this process reads [{rank}])" in out
  _assert_continues(workdir, reference, 3, 4)
