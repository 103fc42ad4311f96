"""One task's episode driven by an external agent harness, as a trained-on Trajectory.

    trajectory = run_episode(task, cfg, base_url=running.base_url, model="tiny",
                             capture_path="served.jsonl", tag="ep-3")

The harness runs as a subprocess in a fresh copy of the task's repository, talking to a
`c2jax serve --capture` at `base_url` under the model name '<model>@<tag>' (the server
serves it as <model> and writes the full name into every captured line, which is how one
episode's requests are told apart from concurrent ones). When it exits, its captured
requests are stitched into segments by exact token prefixes (stitching.py), the hidden tests
grade the copy in a sandbox, and the result is the same Trajectory the native agent loop
returns, so the learner trains on it unchanged.

Harnesses are a registry (launchers.HARNESSES: mini_swe_agent, command): a function
(cfg, Launch) -> (argv, extra env).

The harness executes commands where it would when deployed (mini-swe-agent: its
`environment_class`, 'local' = the copy's directory on this host; choose 'bubblewrap' or
'docker' there for isolation); grading always runs in a c2jax sandbox (cfg.backend).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable

from c2jax.agent.external import stitching as stitch_lib
from c2jax.agent.external.launchers import HARNESSES, Launch
from c2jax.agent.loop import RolloutError, Trajectory
from c2jax.env import reward as reward_lib
from c2jax.env import sandbox as sandbox_lib
from c2jax.env import tasks as tasks_lib
from c2jax.agent.stats import TrajectoryStats
from c2jax.serve import capture as capture_lib


# mini-swe-agent exit statuses -> the agent loop's finish reasons.
_MINI_FINISH = {"Submitted": "finish", "LimitsExceeded": "max_turns",
                "TimeExceeded": "budget", "RepeatedFormatError": "answer"}


def _run(argv, env, cwd, timeout_s, log_path) -> tuple[int | None, bool]:
  """(exit code, timed out); the harness's whole process group dies on a timeout."""
  with open(log_path, "wb") as log:
    process = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    try:
      return process.wait(timeout_s), False
    except subprocess.TimeoutExpired:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait()
      return None, True


def _setup(task: tasks_lib.Task, workdir: str) -> None:
  for command in task.setup_commands:
    done = subprocess.run(["bash", "-c", command], cwd=workdir, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
      raise RolloutError(f"setup command {command!r} of task {task.id} failed "
                         f"({done.returncode}):\n{(done.stdout + done.stderr)[-2000:]}")


def run_episode(task: tasks_lib.Task, cfg, *, base_url: str, model: str,
                capture_path: str, tag: str, seed: int | None = None,
                sandbox_factory: Callable[[str], sandbox_lib.Sandbox] | None = None
                ) -> Trajectory:
  """Runs `task` under the harness cfg.harness (cfg: agent.external config) against the
  server at base_url serving `model` with capture into capture_path; `seed` is handed
  to the harness (mini-swe-agent sends it with every request; a command gets
  C2JAX_SEED), since the server seeds each request from what the client sends. Raises
  RolloutError when the harness crashed or made no request (infrastructure, not the
  policy's doing)."""
  if cfg.harness not in HARNESSES:
    raise ValueError(f"agent.external.harness = {cfg.harness!r}; known harnesses: "
                     f"{sorted(HARNESSES)}.")
  factory = sandbox_factory or (lambda repo: sandbox_lib.make_sandbox(cfg.backend, repo))
  started = time.monotonic()
  root = tempfile.mkdtemp(prefix=f"c2jax-external-{tag}-")
  try:
    workdir, out_dir = os.path.join(root, "repo"), os.path.join(root, "harness")
    shutil.copytree(task.repo, workdir, symlinks=True)
    os.makedirs(out_dir)
    task_file = os.path.join(out_dir, "task.md")
    with open(task_file, "w", encoding="utf-8") as f:
      f.write(task.prompt)
    _setup(task, workdir)
    launch = Launch(base_url, f"{model}@{tag}", workdir, task_file, out_dir, seed)
    argv, env = HARNESSES[cfg.harness](cfg, launch)
    log_path = os.path.join(out_dir, "harness.log")
    # Only lines appended from now on can be this episode's: no rereading a long capture.
    offset = os.path.getsize(capture_path) if os.path.exists(capture_path) else 0
    code, timed_out = _run(argv, env, workdir, cfg.timeout_s, log_path)
    with open(log_path, encoding="utf-8", errors="replace") as f:
      log = f.read()[-3000:]
    if code not in (0, None):
      raise RolloutError(f"{task.id}: harness {cfg.harness!r} exited with {code}:\n{log}")
    rows = stitch_lib.episode_rows(capture_lib.read(capture_path, offset, live=True), launch.model)
    if not rows:
      raise RolloutError(f"{task.id}: harness {cfg.harness!r} made no request to "
                         f"{base_url} as {launch.model!r} (is the server capturing into "
                         f"{capture_path}?):\n{log}")
    segments = stitch_lib.stitch(rows)
    reason = "budget" if timed_out else _finish_reason(cfg, out_dir)
    with factory(workdir) as sandbox:
      passed, _ = reward_lib.run_hidden_tests(sandbox, task, cfg.grade_timeout_s)
    stats = TrajectoryStats.of_chain([s.stats for s in segments])
    messages = _messages(out_dir)
    stats = dataclasses.replace(stats, tests_total=len(passed),
                                tests_passed=sum(passed.values()),
                                tool_call_counts=_tool_call_counts(messages))
    return Trajectory(task.id, segments, stats, reason, messages, passed,
                      time.monotonic() - started)
  finally:
    shutil.rmtree(root, ignore_errors=True)


def _finish_reason(cfg, out_dir: str) -> str:
  if cfg.harness != "mini_swe_agent":
    return "finish"
  path = os.path.join(out_dir, "status")
  status = open(path, encoding="utf-8").read().strip() if os.path.exists(path) else ""
  return _MINI_FINISH.get(status, "answer")


def _tool_call_counts(messages: list[dict]) -> dict[str, int]:
  """Calls per tool name in the harness's transcript (empty when it writes none)."""
  counts: dict[str, int] = {}
  for message in messages:
    for call in message.get("tool_calls") or ():
      name = (call.get("function") or {}).get("name", "")
      counts[name] = counts.get(name, 0) + 1
  return counts


def _messages(out_dir: str) -> list[dict]:
  """The harness's own transcript when it writes one (for reading; training uses tokens)."""
  path = os.path.join(out_dir, "mini.traj.json")
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    messages = json.load(f).get("messages", [])
  keep = ("role", "content", "tool_calls", "tool_call_id")  # what behaviour graders read
  return [{k: m[k] for k in keep if m.get(k) is not None} for m in messages]
