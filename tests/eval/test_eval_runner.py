"""Resume after SIGKILL, torn lines, infra-error retries and accounting, config errors."""

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import ml_collections
import pytest

from c2jax import config as configlib
from c2jax.config import load_config_file
from c2jax.eval import episode, oracle, results, runner, suites

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _lines(workdir):
  return [json.loads(l) for l in (workdir / results.RESULTS).read_text().splitlines()]


@pytest.mark.slow
def test_resume_after_sigkill_loses_and_repeats_nothing(tmp_path):
  workdir = tmp_path / "run"
  command = [sys.executable, "-c", "from c2jax.cli import run; run()", "eval",
             f"--config={ROOT}/configs/eval.py:procgen", f"--workdir={workdir}",
             "--config.suite.args.count=6", "--config.eval.samples=2",
             "--config.eval.ks=(1,2)", "--config.policy.concurrency=1",
             "--config.eval.progress=false"]
  env = dict(os.environ, PYTHONPATH=ROOT, C2JAX_XLA_CACHE="off")
  total = 6 * 2  # (task, sample) pairs; concurrency 1 writes them one at a time
  proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  path = workdir / results.RESULTS
  deadline = time.monotonic() + 240
  while time.monotonic() < deadline:
    if path.exists() and path.read_text().count("\n") >= 4:
      break
    assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  before = _lines(workdir)
  assert 4 <= len(before) < total, "killed too late to test resuming"
  with open(path, "a") as f:  # a torn last line, as a kill mid-write leaves
    f.write('{"task_id": "procgen-d1-10')
  done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  after = _lines(workdir)
  keys = [(r["task_id"], r["sample"]) for r in after]
  assert len(keys) == len(set(keys)) == total  # every (task, sample) once: none lost or redone
  assert after[:len(before)] == before  # what the killed run wrote is kept as it was
  summary = json.loads((workdir / results.SUMMARY).read_text())
  assert summary["overall"]["accuracy"] == 1.0 and summary["torn_lines_redone"] == 1
  transcripts = (workdir / runner.TRANSCRIPTS).read_text().splitlines()
  assert len(transcripts) >= total


def test_sigterm_stops_cleanly_keeps_results_and_the_rerun_finishes(tmp_path):
  workdir = tmp_path / "run"
  command = [sys.executable, "-c", "from c2jax.cli import run; run()", "eval",
             f"--config={ROOT}/configs/eval.py:procgen", f"--workdir={workdir}",
             "--config.suite.args.count=8", "--config.eval.samples=2",
             "--config.eval.ks=(1,2)", "--config.policy.concurrency=2", "--config.eval.progress=false"]
  env = dict(os.environ, PYTHONPATH=ROOT, C2JAX_XLA_CACHE="off")
  proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  path = workdir / results.RESULTS
  deadline = time.monotonic() + 240
  while not (path.exists() and path.read_text().count("\n") >= 1):
    assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  # The handler runs when the child's main thread next gets the CPU; until then its worker
  # threads may start more episodes. Count once it has said it received the signal: from
  # then on nothing new starts, and each worker records its episode before taking another,
  # so at most `concurrency` results are still to come.
  lines, errors = queue.Queue(), queue.Queue()
  readers = [threading.Thread(target=lambda s=stream, q=q: [q.put(line) for line in s],
                              daemon=True)
             for stream, q in ((proc.stdout, lines), (proc.stderr, errors))]
  for reader in readers:
    reader.start()
  printed = []
  while not any("SIGTERM received" in line for line in printed):
    try:
      printed.append(lines.get(timeout=120))
    except queue.Empty:
      pytest.fail(f"c2jax eval did not acknowledge SIGTERM within 120 s:\n{printed}\n"
                  f"{''.join(errors.queue)[-3000:]}")
  seen = path.read_text().count("\n")  # recorded by then (more may be written meanwhile)
  proc.wait(timeout=120)
  for reader in readers:
    reader.join(timeout=10)
  out, err = "".join(printed + list(lines.queue)), "".join(errors.queue)
  assert proc.returncode == 0, err[-3000:]
  before = _lines(workdir)
  # The episodes in flight (at most concurrency = 2) finished and were recorded; nothing
  # else started.
  assert seen <= len(before) <= seen + 2 and len(before) < 16, (seen, len(before),
                                                                out[-2000:])
  assert json.loads((workdir / results.SUMMARY).read_text())["preempted"] is True
  done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  after = _lines(workdir)
  keys = [(r["task_id"], r["sample"]) for r in after]
  assert len(keys) == len(set(keys)) == 16
  assert after[:len(before)] == before
  summary = json.loads((workdir / results.SUMMARY).read_text())
  assert summary["preempted"] is False and summary["overall"]["accuracy"] == 1.0


def test_workers_report_each_episode_before_starting_another():
  # A stop promises that at most `concurrency` results are still to come: a worker must
  # report (record) its episode before it takes the next one, even when reporting is slow.
  lock, begun, reported, gaps = threading.Lock(), [0], [0], []

  def episode_fn(job):
    with lock:
      begun[0] += 1
      gaps.append(begun[0] - reported[0])
    return job

  def on_done(job, outcome):
    assert outcome == job
    time.sleep(0.02)
    with lock:
      reported[0] += 1

  episode.run_in_threads(episode_fn, list(range(12)), on_done, concurrency=2)
  assert reported[0] == 12 and max(gaps) <= 2, gaps


def test_an_episode_error_is_reported_and_a_fatal_one_raises():
  outcomes = {}
  def episode_fn(job):
    if job == 1:
      raise RuntimeError("sandbox died")
    if job == 2:
      raise KeyboardInterrupt
    return "ok"
  def on_done(job, outcome):
    outcomes[job] = outcome
  episode.run_in_threads(episode_fn, [0, 1], on_done, concurrency=2)
  assert outcomes[0] == "ok" and isinstance(outcomes[1], episode.InfraError)
  assert "RuntimeError: sandbox died" in str(outcomes[1])
  with pytest.raises(KeyboardInterrupt):
    episode.run_in_threads(episode_fn, [2, 0], on_done, concurrency=1, fatal=(KeyboardInterrupt,))


class FlakyPolicy:
  """Wraps the oracle; each job raises InfraError on its first `failures` attempts."""

  def __init__(self, failures):
    self.inner = oracle.OraclePolicy("bubblewrap", concurrency=2)
    self.failures, self.label = failures, "flaky"
    self.calls = collections.Counter()

  def run(self, jobs, on_done, should_start=None):
    good = []
    for job in jobs:
      self.calls[job.key] += 1
      if self.calls[job.key] <= self.failures:
        on_done(job, episode.InfraError("endpoint: HTTP 503"))
      else:
        good.append(job)
    self.inner.run(good, on_done, should_start)

  def close(self):
    pass


@pytest.fixture(scope="module")
def procgen_tasks(tmp_path_factory):
  args = suites.get_suite("procgen").defaults()
  args.count = 3
  return suites.build_tasks(suites.get_suite("procgen"), args,
                            str(tmp_path_factory.mktemp("tasks")))


def test_transient_infra_errors_are_retried_not_scored(tmp_path, procgen_tasks):
  policy = FlakyPolicy(failures=2)
  summary = runner.evaluate_tasks(policy, procgen_tasks, tmp_path, samples=2, retries=2,
                                  retry_backoff_s=0.0, progress=False)["overall"]
  assert summary["accuracy"] == 1.0 and summary["infra_errors"] == 0
  assert set(policy.calls.values()) == {3}
  assert {r["attempts"] for r in _lines(tmp_path)} == {3}


def test_persistent_infra_errors_are_reported_apart_and_retried_on_rerun(tmp_path,
                                                                         procgen_tasks):
  summary = runner.evaluate_tasks(FlakyPolicy(failures=5), procgen_tasks, tmp_path,
                                  samples=2, retries=1, retry_backoff_s=0.0,
                                  progress=False)["overall"]
  assert summary["infra_errors"] == 6 and summary["episodes"] == 0
  assert summary["accuracy"] is None  # no model result: not a 0% model
  assert summary["infra_error_tasks"] == sorted(t.id for t in procgen_tasks)
  assert all("HTTP 503" in r["infra_error"] for r in _lines(tmp_path))
  # The infrastructure recovers: a rerun retries exactly the infra-error pairs.
  rerun = runner.evaluate_tasks(FlakyPolicy(failures=0), procgen_tasks, tmp_path, samples=2,
                                retries=1, progress=False)["overall"]
  assert rerun["accuracy"] == 1.0 and rerun["infra_errors"] == 0 and rerun["episodes"] == 6


def _config(arg="procgen", **overrides):
  cfg = load_config_file(os.path.join(ROOT, "configs/eval.py"), arg)
  configlib.apply_overrides(cfg, overrides)
  return cfg


@pytest.mark.parametrize("overrides, key", [
    ({"suite": {"name": "nope"}}, "suite.name"),
    ({"policy": {"kind": "vllm"}}, "policy.kind"),
    ({"eval": {"ks": (1, 8)}}, "eval.ks"),
    ({"policy": {"kind": "openai"}}, "policy.base_url"),
    ({"policy": {"kind": "openai", "base_url": "http://x", "model": "m",
                 "tool_calls": "xml"}}, "policy.tool_calls"),
    ({"policy": {"kind": "engine"}}, "policy.run"),
    ({"policy": {"retries": -1}}, "policy.retries"),
    ({"agent": {"max_turns": 0}}, "agent.max_turns"),
    ({"agent": {"sandbox_disk_mb": 0}}, "agent.sandbox_disk_mb"),
])
def test_config_errors_name_the_key(overrides, key):
  cfg = _config()
  with pytest.raises(configlib.ConfigError) as err:
    configlib.apply_overrides(cfg, overrides)
    runner.validate(cfg)
  assert str(err.value).startswith(f"config.{key}"), str(err.value)


def test_unknown_suite_argument_is_named():
  cfg = _config()
  cfg.suite.args.cuont = 3  # a config built in Python: absl never saw it
  with pytest.raises(configlib.ConfigError, match=r"^config.suite.args.cuont: is not a known"):
    runner.validate(cfg)


def test_one_writer_per_run_dir(tmp_path):
  with results.ResultsStore(tmp_path):
    with pytest.raises(RuntimeError, match="another process is writing"):
      results.ResultsStore(tmp_path)
  results.ResultsStore(tmp_path).close()  # free again once the first one closed


def test_resumed_run_with_a_different_config_is_refused(tmp_path):
  results.pin_config(tmp_path, {"suite": {"name": "procgen"}})
  with pytest.raises(ValueError, match=r"changed: \['suite'\]"):
    results.pin_config(tmp_path, {"suite": {"name": "eager_editing"}})


@pytest.mark.parametrize("arg", ["procgen", "eager_editing", "instruction_following",
                                 "procgen,tiny", "swebench"])
def test_config_variants_validate(arg):
  runner.validate(_config(arg))


@suites.register_suite("test_scored_squares", defaults=lambda: ml_collections.ConfigDict(
    dict(count=5)), kind="scored")
def _scored_squares(args, policy, out_dir, done):
  """A non-agent suite: scores cases itself (as base-model evals do)."""
  for i in range(args.count):
    if f"case-{i}" not in done:
      yield {"task_id": f"case-{i}", "score": float(i % 2), "policy_seen": policy.label}


def test_scored_suites_share_the_runner_results_and_resume(tmp_path):
  cfg = _config()
  cfg.suite.name = "test_scored_squares"
  cfg.suite.args = suites.get_suite("test_scored_squares").defaults()
  cfg.eval.progress = False

  class Model:
    label = "base-ckpt"

  summary = runner.run_scored(cfg, suites.get_suite("test_scored_squares"), Model(), tmp_path)
  assert summary["overall"]["episodes"] == 5
  assert summary["overall"]["accuracy"] == pytest.approx(2 / 5)
  lines = (tmp_path / results.RESULTS).read_text().splitlines()
  runner.run_scored(cfg, suites.get_suite("test_scored_squares"), Model(), tmp_path)
  assert (tmp_path / results.RESULTS).read_text().splitlines() == lines  # nothing redone
  assert json.loads(lines[0])["policy_seen"] == "base-ckpt"
