"""A rollout actor: lease a prompt, roll out its group in sandboxes, queue it, repeat.

    python -m c2jax.rl.actors.actor --workdir=RUN --actor_id=actor0 --weights=RUN/weights/<run>

The learner starts actors (as local processes running `run`, or as Ray tasks running
`serve` through c2jax.rl.actors.ray_link on machines that share no disk with it) and restarts
them if they die. An actor holds one engine; each leased prompt becomes
`config.rl.group_size` concurrent episodes in its slots. Between
decode steps it polls the weight directory and swaps in newer weights in flight, so
tokens sampled later in a rollout carry newer policy versions. With
config.actors.num_draft_tokens > 0 the engine decodes speculatively with the policy's MTP
heads, which arrive with every weight version (the learner trains them online), and each
group carries its draft counts (info: verify_steps, accepted_drafts). A finished group is put
on the queue (blocking while the queue is full: back-pressure), then the lease is
completed; if the actor dies before that, the learner returns the lease to the pool and
another actor rolls the prompt out again (only in-flight rollouts are lost). A group
lost to infrastructure (sandbox or engine failures beyond config.rl.infra.retries) is
dropped and its prompt returned to the pool (c2jax.rl.actors.infra); after an engine failure
the actor exits non-zero so the learner restarts it with a fresh engine.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pathlib
import signal
import sys
import time
import zlib

from c2jax import compile_cache
from c2jax.train import profiling
from c2jax.rl.actors import infra
from c2jax.rl.actors import rollouts

_LIBC_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
  """Linux: SIGKILL this process when the process that started it dies, so a killed
  learner leaves no actor behind writing to its queue."""
  try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_LIBC_PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):
    pass  # not Linux: the parent-pid check in the loop covers it


class _WeightSync:
  """Polls the weight directory at most every `interval_s` and stages new weights."""

  def __init__(self, engine, subscriber, like, interval_s: float):
    self.engine, self.subscriber, self.like = engine, subscriber, like
    self.interval_s, self._last = interval_s, time.monotonic()

  def __call__(self) -> None:
    now = time.monotonic()
    if now - self._last < self.interval_s:
      return
    self._last = now
    update = self.subscriber.poll(like=self.like)
    if update is not None:
      params, version = update
      self.engine.update_params(params, version)


class _DraftCounter:
  """Speculative-decoding counts of one group's rollouts: the engine's running totals
  (AcceptanceStats) since construction. An actor rolls out one group at a time, so the
  difference is this group's alone; the learner logs them per step."""

  def __init__(self, engine, num_draft: int):
    self.engine, self.num_draft = engine, num_draft
    self.start = self._totals()

  def _totals(self) -> tuple[int, int]:
    stats = getattr(self.engine, "acceptance", None) if self.num_draft else None
    return (0, 0) if stats is None else (stats.steps, stats.accepted)

  def counts(self) -> dict:
    if not self.num_draft:
      return {}
    steps, accepted = self._totals()
    return {"draft_tokens": self.num_draft, "verify_steps": steps - self.start[0],
            "accepted_drafts": accepted - self.start[1]}


def _wait_for_weights(subscriber, timeout_s: float = 600.0):
  deadline = time.monotonic() + timeout_s
  while True:
    update = subscriber.poll()
    if update is not None:
      return update
    if time.monotonic() > deadline:
      raise TimeoutError(f"No weights were published in {subscriber.directory} within "
                         f"{timeout_s:.0f}s; is the learner running?")
    time.sleep(0.2)


def run(workdir: str, actor_id: str, weights_dir: str, parent_pid: int | None = None) -> int:
  """The actor loop over a run directory this machine sees (the process backend)."""
  from c2jax import data  # pylint: disable=g-import-not-at-top

  dirs = rollouts.RunDirs(pathlib.Path(workdir))
  cfg = rollouts.load_config(dirs)
  tokenizer = data.prepare_from_config(cfg.data, progress=False).tokenizer()
  return serve(cfg, dirs, dirs.pool(), dirs.queue(cfg), tokenizer, actor_id, weights_dir,
               parent_pid)


def serve(cfg, dirs, pool, queue, tokenizer, actor_id: str, weights_dir: str,
          parent_pid: int | None = None, repos=None) -> int:
  """Leases prompts from `pool` and puts their groups on `queue` until the pool has no
  prompts left (returns 0). `dirs` receives infra counts (a RunDirs, or a stand-in
  with `record_infra`); `repos`, when given, fetches each task's repository to local
  disk (c2jax.rl.actors.ray_link: no shared file system)."""
  from c2jax.rollout import weights as weights_lib  # pylint: disable=g-import-not-at-top
  from c2jax.rollout import JaxEngine  # pylint: disable=g-import-not-at-top

  subscriber = weights_lib.WeightSubscriber(weights_dir)
  if cfg.actors.processes > 1:
    params, version = _agreed_weights(subscriber)
  else:
    params, version = _wait_for_weights(subscriber)
  # Host arrays: the engine places them itself (sharded by actors.parallel).
  engine = JaxEngine(cfg.model, params, num_slots=cfg.actors.slots,
                     max_length=cfg.actors.max_length, version=version,
                     detokenize=tokenizer.decode, seed=zlib.crc32(actor_id.encode()),
                     parallel=cfg.actors.parallel,
                     num_draft_tokens=cfg.actors.num_draft_tokens,
                     weights_quant=cfg.actors.weights_quant,
                     hang_timeout_s=cfg.actors.hang_timeout_s)
  if not engine.is_leader:
    # A process other than 0 of a multi-process actor (config.actors.processes): it runs
    # the engine programs process 0 runs, loading each version process 0 swaps in.
    print(f"{actor_id}: process {_process()} follows process 0's engine", flush=True)
    engine.follow(lambda version: subscriber.load(version))
    return 0
  try:
    return _lead(cfg, dirs, pool, queue, tokenizer, actor_id, weights_dir, parent_pid, repos,
                 engine, subscriber, version)
  finally:
    engine.stop_followers()


def _process() -> str:
  import jax  # pylint: disable=g-import-not-at-top

  return f"{jax.process_index()} of {jax.process_count()}"


def _agreed_weights(subscriber):
  """The weights every process of a multi-process actor starts from: the version process 0
  found first, loaded by each process from the weight directory."""
  from c2jax.parallel import distributed  # pylint: disable=g-import-not-at-top
  from c2jax.rollout import lockstep  # pylint: disable=g-import-not-at-top

  found = _wait_for_weights(subscriber) if distributed.is_leader() else None
  version = int(lockstep.share("actor/start_version", None if found is None else found[1]))
  return (found if found is not None else (subscriber.load(version), version))


def _lead(cfg, dirs, pool, queue, tokenizer, actor_id, weights_dir, parent_pid, repos, engine,
          subscriber, version) -> int:
  """The actor loop of `serve` on the process that schedules the engine."""
  # Later versions are read straight into the engine's layout (no whole copy on one device).
  sync = _WeightSync(engine, subscriber, engine.param_like(), cfg.actors.weight_poll_s)
  external = None
  # External harness: the engine is served over HTTP on daemon threads (they end with
  # the actor), and a weight follower stages new versions instead of `sync`.
  if cfg.agent.external.enabled:
    from c2jax.rl.actors import external_rollouts  # pylint: disable=g-import-not-at-top
    external = external_rollouts.ExternalGroups(
        engine, tokenizer, cfg.agent, vocab_size=cfg.model.vocab_size, actor_id=actor_id,
        capture_path=str(dirs.actors / f"{actor_id}.capture.jsonl"),
        retries=cfg.rl.infra.retries, weights_dir=weights_dir,
        weight_poll_s=cfg.actors.weight_poll_s)

  def on_step():
    if parent_pid is not None and os.getppid() != parent_pid:
      raise SystemExit(f"{actor_id}: the learner (pid {parent_pid}) is gone; stopping.")
    if external is None:
      with profiling.span("actor/weights"):
        sync()

  # config.profile.steps = (a, b): trace the rollouts made with policy versions a-1..b-1,
  # the ones learner steps a..b start from (a trace per process, on this machine's disk;
  # Ray actors, whose run directory is remote, do not trace).
  root = getattr(dirs, "root", None)
  trace = (profiling.trace_of(cfg.profile, pathlib.Path(root) / "profile" / actor_id)
           if root is not None else profiling.StepTrace(None, "."))
  if trace.steps is not None:
    # The learner stops its actors with SIGTERM: end the loop so the trace is written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
  print(f"{actor_id}: ready with weights version {version}", flush=True)
  try:
    while True:
      on_step()
      leased = pool.lease(actor_id)
      if leased is None:
        if pool.exhausted():
          print(f"{actor_id}: no prompts left; exiting.", flush=True)
          return 0
        time.sleep(0.2)
        continue
      task_id, payload = leased
      if repos is not None:
        payload = repos.localize(payload)
      trace.before(engine.version + 1)
      try:
        outcome = roll_out_prompt(cfg, dirs, engine, tokenizer, pool, queue, actor_id,
                                  task_id, payload, on_step, external=external)
      finally:
        if repos is not None:
          repos.forget(payload)
      trace.after(engine.version + 1)
      if outcome == "engine_error":
        return 1  # the engine's state is suspect: exit, and the learner restarts us
  finally:
    trace.close()


def roll_out_prompt(cfg, dirs, engine, tokenizer, pool, queue, actor_id: str, task_id: str,
                    payload: dict, on_step=None, sandbox_factory=None,
                    external=None) -> str:
  """Rolls out one leased prompt's group and queues it: 'queued'; or, when
  infrastructure failed beyond the retries, drops the group (never scored) and returns
  the prompt to the pool (c2jax.rl.actors.infra): 'dropped', or 'engine_error' when the
  engine failed (the caller should restart it). With `external` (an
  external_rollouts.ExternalGroups), an external harness rolls the group out."""
  from c2jax.agent import loop as agent_loop  # pylint: disable=g-import-not-at-top
  from c2jax.env import tasks as tasks_lib  # pylint: disable=g-import-not-at-top

  task = tasks_lib.Task.from_json(payload["task"])
  group_size = cfg.rl.group_size
  started = time.monotonic()
  drafting = _DraftCounter(engine, cfg.actors.num_draft_tokens)
  try:
    seeds = rollouts.rollout_seeds(task_id, group_size, cfg.learner.seed)
    with profiling.span("actor/rollout"):
      if external is not None:
        trajectories = external.run_group(task, seeds)
      else:
        trajectories = agent_loop.run_episodes(
            engine, tokenizer, cfg.agent, [task] * group_size, seeds=seeds, on_step=on_step,
            sandbox_factory=sandbox_factory, infra_retries=cfg.rl.infra.retries)
    # Behaviour graders run here (a failed judge endpoint is a RolloutError too).
    group, metrics = rollouts.make_group(cfg.rl, task_id, trajectories)
  except agent_loop.RolloutError as err:
    returned = infra.drop_group(cfg.rl.infra, dirs, pool, actor_id, task_id,
                                retries=err.retries)
    fate = "back in the pool" if returned else "dropped for good (it keeps failing)"
    logging.error("%s: prompt %s failed for infrastructure reasons: %s", actor_id,
                  task_id, err)
    print(f"{actor_id}: group of {task_id} dropped (infrastructure: {err}); prompt "
          f"{fate}", flush=True)
    return "engine_error" if isinstance(err, agent_loop.EngineError) else "dropped"
  retried = sum(t.infra_retries for t in trajectories)
  if retried:
    infra.record(dirs, actor_id, infra_retries=retried)
  group.info["actor"] = actor_id
  group.info.update(drafting.counts())
  with profiling.span("actor/queue"):
    queue.put(group)  # blocks while the queue is full (back-pressure)
  pool.complete(actor_id, task_id)
  print(f"{actor_id}: {task_id} reward {metrics['reward']:+.3f} pass "
        f"{metrics['pass_rate']:.2f} in {time.monotonic() - started:.1f}s "
        f"(policy v{group.policy_version})", flush=True)
  return "queued"


def main(argv: list[str]) -> int:
  import argparse  # pylint: disable=g-import-not-at-top

  parser = argparse.ArgumentParser(prog="python -m c2jax.rl.actors.actor")
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--actor_id", required=True)
  parser.add_argument("--weights", required=True)
  parser.add_argument("--parent_pid", type=int, default=None)
  args = parser.parse_args(argv)
  if args.parent_pid is not None:
    _die_with_parent()
    if os.getppid() != args.parent_pid:
      return 1  # the parent died before we could arm the signal
  compile_cache.enable()  # actors start without the cli: every one would compile anew
  # The processes of a multi-process actor (config.actors.processes, JAX_* set by the
  # process backend) join before anything touches a device; alone, nothing happens.
  from c2jax.parallel import distributed  # pylint: disable=g-import-not-at-top
  distributed.initialize(distributed.distributed_defaults())
  return run(args.workdir, args.actor_id, args.weights, args.parent_pid)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
