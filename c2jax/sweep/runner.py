"""Runs a sweep's points, N at a time, as local processes or Ray tasks; resumable.

Every point is its own process (`c2jax <verb> ... --workdir=DIR/runs/<point>`) writing to
its own run directory:

  sweep_point.json   what the directory belongs to (verb, config, overrides); a rerun of a
                     different point into it is refused
  sweep.log          the process's stdout and stderr, every attempt appended
  sweep_done.json    written once the process exited 0: the point is finished
  sweep_failed.json  the last attempt's exit code (a rerun of the sweep tries it again)
  .sweep.lock        held (flock) by the point's process while it runs

A rerun of the sweep skips finished points and relaunches the others, which resume from
their own checkpoints. Children die with the runner (PR_SET_PDEATHSIG on Linux), so killing
the runner never leaves a point running unseen; the lock catches any that survive.
DIR/launches.jsonl records every launch.

SIGTERM or SIGINT to the runner (c2jax.preemption) stops the sweep cleanly: no point
starts any more, the running points get SIGTERM (each checkpoints and exits 0, leaving
`preempted.json` in its directory, so it is not marked done), the runner waits up to
STOP_GRACE_S for them, writes the table of what is finished and returns with
`preempted` set (exit status 0); rerunning the sweep resumes the stopped points. Points
run in their own sessions, so a Ctrl-C in the terminal reaches only the runner. On the
Ray backend running points are cancelled instead and resume from their last periodic
checkpoint.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from c2jax import preemption
from c2jax.sweep import table
from c2jax.sweep.spec import Plan, Point, SweepError

POINT_FILE = "sweep_point.json"
DONE_FILE = "sweep_done.json"
FAILED_FILE = "sweep_failed.json"
LOG_FILE = "sweep.log"
LOCK_FILE = ".sweep.lock"
LAUNCHES_FILE = "launches.jsonl"
BACKENDS = ("local", "ray")
HEARTBEAT_S = 30.0
STOP_GRACE_S = 300.0  # how long a stopping sweep waits for its points' checkpoints


def run_dir(workdir: pathlib.Path, point: Point) -> pathlib.Path:
  return workdir / "runs" / point.name


def status(directory: pathlib.Path) -> str:
  if (directory / DONE_FILE).exists():
    return "done"
  if (directory / FAILED_FILE).exists():
    return "failed"
  return "pending"


def check_run_dirs(plan: Plan, workdir: pathlib.Path) -> None:
  """Refuses run directories made by another point, and points still running elsewhere."""
  for point in plan.points:
    directory = run_dir(workdir, point)
    pinned = directory / POINT_FILE
    wanted = point.identity(plan.sweep.verb, plan.config_spec)
    if pinned.exists():
      found = json.loads(pinned.read_text())
      if found != wanted:
        changed = sorted(key for key in set(found) | set(wanted) if found.get(key) != wanted.get(key))
        raise SweepError(f"{directory} belongs to another point (its {', '.join(changed)} "
                         f"differ from point {point.name}'s); use another --workdir or delete it.")
    if (directory / LOCK_FILE).exists() and status(directory) != "done":
      with open(directory / LOCK_FILE, "a+") as lock:
        try:
          fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
          lock.seek(0)
          raise SweepError(f"point {point.name} is still running in another process (pid "
                           f"{lock.read().strip() or '?'}); wait for it or kill it.") from None


# Resolved here, in the parent: between fork and exec the child must not dlopen or allocate
# (another thread of the parent may have held the loader or malloc lock at the fork).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1
_SIGKILL = int(signal.SIGKILL)


def _die_with_parent() -> None:
  """In the child, before exec: SIGKILL it when the thread that started it dies."""
  _PRCTL(_PR_SET_PDEATHSIG, _SIGKILL)


class Started:
  """A point's running process with its open lock and log."""

  def __init__(self, command: list[str], directory: pathlib.Path):
    directory.mkdir(parents=True, exist_ok=True)
    self.directory = directory
    self.lock = open(directory / LOCK_FILE, "a+")
    try:
      fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      self.lock.close()
      raise SweepError(f"point {directory.name} is already running in another process.") from None
    self.log = open(directory / LOG_FILE, "ab")
    self.log.write(f"\n=== sweep launch {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                   f"{' '.join(command)}\n".encode())
    self.log.flush()
    (directory / FAILED_FILE).unlink(missing_ok=True)
    self.started = time.time()
    # The child inherits the locked descriptor: the lock stays held while it runs, even if
    # this process dies first.
    self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, pass_fds=(self.lock.fileno(),),
                                    preexec_fn=_die_with_parent if _PRCTL else None,
                                    start_new_session=True)
    self.lock.seek(0)
    self.lock.truncate()
    self.lock.write(str(self.process.pid))
    self.lock.flush()

  def finish(self, returncode: int) -> float:
    """Writes the done / failed marker and releases the lock; returns the seconds taken."""
    seconds = round(time.time() - self.started, 2)
    # Where the point ran: this process is the runner, or a Ray worker on some node.
    record = {"returncode": returncode, "seconds": seconds,
              "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": socket.gethostname(),
              "launcher_pid": os.getpid()}
    if returncode == 0 and preemption.was_preempted(self.directory):
      pass  # stopped on a signal with a checkpoint: neither done nor failed
    else:
      marker = DONE_FILE if returncode == 0 else FAILED_FILE
      (self.directory / marker).write_text(json.dumps(record) + "\n")
    self.log.close()
    self.lock.close()
    return seconds

  def stop(self) -> None:
    if self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()
    self.log.close()
    self.lock.close()


def run_point(args: list[str], directory: str) -> tuple[int, float]:
  """One point to the end in this process's Python (the body of a Ray task)."""
  started = Started([sys.executable] + args, pathlib.Path(directory))
  try:
    returncode = started.process.wait()
  except BaseException:
    started.stop()
    raise
  return returncode, started.finish(returncode)


class LocalBackend:
  """Points as child processes of this one, started and polled from the main thread (a
  child's death signal follows the thread that started it)."""

  def __init__(self):
    self.running: dict[str, Started] = {}

  def submit(self, name: str, command: list[str], directory: pathlib.Path) -> None:
    self.running[name] = Started(command, directory)

  def wait(self, timeout: float) -> list[tuple[str, int, float]]:
    deadline = time.time() + timeout
    while True:
      finished = [(name, s.process.poll()) for name, s in self.running.items()]
      finished = [(name, rc) for name, rc in finished if rc is not None]
      if finished or time.time() >= deadline:
        return [(name, rc, self.running.pop(name).finish(rc)) for name, rc in finished]
      time.sleep(0.2)

  def interrupt(self) -> None:
    """Asks every running point to checkpoint and exit (SIGTERM)."""
    for started in self.running.values():
      if started.process.poll() is None:
        started.process.send_signal(signal.SIGTERM)

  def stop(self) -> None:
    for started in self.running.values():
      started.stop()
    self.running.clear()


NODE_LOSS_RETRIES = 3


class RayBackend:
  """Points as Ray tasks (one CPU each unless told): on a cluster, every node must see
  the sweep's work directory (shared storage) and have c2jax installed."""

  def __init__(self, cpus_per_point: float = 1.0):
    try:
      import ray  # only for --backend=ray
    except ImportError:
      raise SweepError("--backend=ray needs Ray: pip install 'c2jax[ray]'.") from None

    self.ray = ray
    if not ray.is_initialized():
      ray.init(address=os.environ.get("RAY_ADDRESS"))
    # Ray retries a task only when its worker or node dies, never when the point itself
    # fails: a point on a lost node reruns on another (and resumes from its checkpoints).
    self.task = ray.remote(num_cpus=cpus_per_point, max_retries=NODE_LOSS_RETRIES)(run_point)
    self.running: dict = {}  # object ref -> (point name, run directory)

  def submit(self, name: str, command: list[str], directory: pathlib.Path) -> None:
    # The worker's own Python runs the point: the driver's may not exist on that node.
    self.running[self.task.remote(command[1:], str(directory))] = (name, directory)

  def wait(self, timeout: float) -> list[tuple[str, int, float]]:
    if not self.running:
      return []
    ready, _ = self.ray.wait(list(self.running), num_returns=len(self.running),
                             timeout=timeout, fetch_local=True)
    results = []
    for ref in ready:
      name, directory = self.running.pop(ref)
      try:
        returncode, seconds = self.ray.get(ref)
      except Exception as err:  # pylint: disable=broad-except  (the worker died: OOM, node lost)
        returncode, seconds = -1, 0.0
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        (directory / FAILED_FILE).write_text(json.dumps(
            {"returncode": returncode, "ray_error": reason}) + "\n")
        with open(directory / LOG_FILE, "a") as log:
          log.write(f"\n=== sweep: the Ray task running this point failed: {err}\n")
      results.append((name, returncode, seconds))
    return results

  def interrupt(self) -> None:
    self.stop()  # cancelled points resume from their last periodic checkpoint

  def stop(self) -> None:
    for ref in self.running:
      self.ray.cancel(ref, force=True)
    self.running.clear()


class Progress:
  """Points done / running / failed, rate and ETA, printed on every change and heartbeat."""

  def __init__(self, total: int, done: int, say: Callable[[str], None]):
    self.total, self.done, self.failed, self.running = total, done, 0, 0
    self.began, self.finished_here, self.say = time.time(), 0, say
    self.last_print = 0.0

  def line(self) -> str:
    pending = self.total - self.done - self.failed - self.running
    text = (f"sweep: {self.done}/{self.total} done, {self.running} running, "
            f"{self.failed} failed, {pending} pending")
    elapsed = time.time() - self.began
    if self.finished_here and elapsed > 0:
      rate = self.finished_here / elapsed
      eta = (pending + self.running) / rate
      text += f" | {rate * 60:.2f} points/min | ETA {_duration(eta)}"
    return text

  def show(self) -> None:
    self.last_print = time.time()
    self.say(self.line())


def _duration(seconds: float) -> str:
  seconds = int(round(seconds))
  if seconds >= 3600:
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
  return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _log_tail(path: pathlib.Path, lines: int = 6) -> str:
  with contextlib.suppress(OSError):
    tail = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join("    | " + line for line in tail)
  return ""


def run(plan: Plan, workdir: pathlib.Path, *, parallel: int = 1, backend: str = "local",
        say: Callable[[str], None] = lambda text: print(text, flush=True)) -> dict:
  """Runs every unfinished point, then writes the table and plots; returns a summary
  {"done", "failed", "launched", "table", ...}. Failed points do not stop the others."""
  if parallel < 1:
    raise SweepError(f"--parallel={parallel}: must be >= 1.")
  if backend not in BACKENDS:
    raise SweepError(f"--backend={backend}: expected one of {list(BACKENDS)}.")
  workdir = pathlib.Path(workdir).expanduser().resolve()
  workdir.mkdir(parents=True, exist_ok=True)
  check_run_dirs(plan, workdir)
  (workdir / "sweep.json").write_text(json.dumps(describe(plan), indent=2) + "\n")
  by_name = {point.name: point for point in plan.points}
  todo = [p for p in plan.points if status(run_dir(workdir, p)) != "done"]
  progress = Progress(len(plan.points), len(plan.points) - len(todo), say)
  say(f"sweep: {len(plan.points)} points of {plan.source.name} ({plan.sweep.verb}, "
      f"{plan.config_spec}); {progress.done} already done; {backend} backend, "
      f"{parallel} at a time; work directory {workdir}")
  failed: dict[str, int] = {}
  launched: list[str] = []
  runner = LocalBackend() if backend == "local" else RayBackend()
  stop, stopping_since = preemption.StopRequest().install(), None
  try:
    while todo or progress.running:
      if stop.requested and stopping_since is None:
        stopping_since = time.time()
        say(f"sweep: stopping: {len(todo)} point(s) not started, {progress.running} asked "
            "to checkpoint and exit; rerun the same command to resume")
        todo = []
        runner.interrupt()
        if backend != "local":
          progress.running = 0
          break
      if stopping_since is not None and time.time() - stopping_since > STOP_GRACE_S:
        break  # the points still running are killed below; they resume from checkpoints
      while todo and progress.running < parallel:
        point = todo.pop(0)
        directory = run_dir(workdir, point)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / POINT_FILE).write_text(
            json.dumps(point.identity(plan.sweep.verb, plan.config_spec), indent=2) + "\n")
        runner.submit(point.name, plan.command(point, directory), directory)
        launched.append(point.name)
        with open(workdir / LAUNCHES_FILE, "a") as f:
          f.write(json.dumps({"point": point.name, "time": round(time.time(), 3),
                              "backend": backend}) + "\n")
        progress.running += 1
        say(f"sweep: start {point.name} (log {directory / LOG_FILE})")
      for name, returncode, seconds in runner.wait(timeout=1.0):
        progress.running -= 1
        progress.finished_here += 1
        log = run_dir(workdir, by_name[name]) / LOG_FILE
        if returncode == 0 and preemption.was_preempted(log.parent):
          say(f"sweep: stopped {name} after {seconds:.0f}s (it resumes on the next run)")
        elif returncode == 0:
          progress.done += 1
          say(f"sweep: done {name} in {seconds:.0f}s")
        else:
          progress.failed += 1
          failed[name] = returncode
          say(f"sweep: FAILED {name} (exit {returncode}); log {log}\n{_log_tail(log)}")
        progress.show()
      if time.time() - progress.last_print >= HEARTBEAT_S:
        progress.show()
  finally:
    runner.stop()
    stop.uninstall()
  statuses = {p.name: status(run_dir(workdir, p)) for p in plan.points}
  outputs = table.write(plan, workdir, statuses, run_dir=lambda p: run_dir(workdir, p), say=say)
  summary = {"points": len(plan.points), "done": sum(s == "done" for s in statuses.values()),
             "failed": sorted(failed), "launched": launched,
             "preempted": stopping_since is not None, **outputs}
  if failed:
    say("sweep: failed points (rerun the same command to retry them):\n" + "\n".join(
        f"  {name}: exit {rc}, log {run_dir(workdir, by_name[name]) / LOG_FILE}"
        for name, rc in failed.items()))
  return summary


def describe(plan: Plan) -> dict:
  return {"sweep": str(plan.source), "verb": plan.sweep.verb, "config": plan.config_spec,
          "axes": list(plan.axes), "metrics": list(plan.sweep.metrics),
          "points": {p.name: p.identity(plan.sweep.verb, plan.config_spec)["overrides"]
                     for p in plan.points}}


def dry_run(plan: Plan, workdir: pathlib.Path, say: Callable[[str], None]) -> None:
  """Lists the points, their run directories' status and the first point's command."""
  workdir = pathlib.Path(workdir).expanduser().resolve()
  say(f"sweep: {len(plan.points)} points of {plan.source.name} ({plan.sweep.verb}, "
      f"{plan.config_spec}); axes {list(plan.axes)}; metrics {list(plan.sweep.metrics)}")
  for point in plan.points:
    directory = run_dir(workdir, point)
    swept = " ".join(f"{k}={v!r}" for k, v in point.swept.items())
    say(f"  {status(directory):<8} {point.name:<40} {swept}")
  first = plan.points[0]
  say("command of the first point:\n  " + " ".join(plan.command(first, run_dir(workdir, first))))
