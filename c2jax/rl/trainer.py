"""`c2jax rl`: the learner loop, with its actors, queue, weight publishing and evals.

    summary = train(cfg, workdir)

Per step: take `learner.groups_per_step` finished groups from the queue (each within
`rl.queue.max_lag` versions of the learner), pack their segments into one batch, run the
jitted `rl_step`, record the groups as trained at this step, publish the new weights (a
delta) for the actors, checkpoint. The learner runs on the shared training runtime
(c2jax.rl.learner.runtime): sharded as config.parallel says, metrics read one step late,
a non-finite loss stops the run naming the step before anything is saved. Time spent
waiting for groups is the learner's idle time. Held-out evaluation (pass rate,
best-of-k) runs at step 0 and every `eval.every` steps with the learner's own engine.
With a running curriculum (config.rl.curriculum.sampling = 'running') the learner also
folds each step's groups into the curriculum's statistics, keeps the pool filled with
prompts drawn by them, and checkpoints them with the parameters
(c2jax.rl.tasks.curriculum_pool).

Multi-process (config.parallel.distributed, c2jax.parallel.distributed): start the same
command once per process. Process 0 leads: it owns the run directory, the task pool, the
queue, the actors, the weight publisher, the metrics and the evals. Every process
restores, steps and checkpoints its shards of the state; process 0 broadcasts each
step's packed batch, and the new parameters are gathered to it once to be published.

Rerunning the same command resumes: the newest readable checkpoint gives the step and
state; groups trained after it go back to the queue (`GroupQueue.recover`), prompts
leased to actors of the previous run go back to the pool, and weights are republished
to a fresh directory, so no finished group is lost or trained twice.

SIGTERM or SIGINT (c2jax.preemption) stops the learner after the step in flight (or, on
a single process, at once while it waits for groups): it checkpoints that step, stops
the actors (their leased prompts go back to the pool; the queue is on disk) and returns
with `preempted` set, so the command exits 0 and rerunning resumes exactly. Several
learner processes agree on the step through JAX's preemption sync point. The actors are
checked every `actors.check_every_s` seconds whatever the queue holds
(c2jax.rl.actors.backends).
"""

from __future__ import annotations

import json
import pathlib
import queue as queue_lib
import time

import jax
import numpy as np

from c2jax import data
from c2jax import preemption
from c2jax.env import procgen
from c2jax.env import tasks as tasks_lib
from c2jax.parallel import distributed
from c2jax.rl.actors import backends as actors_lib
from c2jax.rl.tasks import curriculum_pool
from c2jax.rl import heldout as heldout_lib
from c2jax.rl import job
from c2jax.rl.actors import infra
from c2jax.rl.learner import runtime as learner_runtime
from c2jax.rl.actors import rollouts
from c2jax.rl.tasks import task_sources
from c2jax.rollout import weights as weights_lib
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import metrics as metrics_lib
from c2jax.train import model_source, runtime

_HELDOUT_SEED_OFFSET = 1_000_000  # held-out repositories never share a seed with training


def build_tasks(cfg, dirs: rollouts.RunDirs) -> None:
  """Generates the train prompts and the held-out tasks (once per run). The train prompts
  go into the pool, or with a running curriculum to tasks/train.jsonl (it draws them)."""
  if dirs.heldout.exists():
    return
  dirs.heldout.parent.mkdir(parents=True, exist_ok=True)
  if cfg.tasks.source != "procgen":
    train_tasks, heldout = task_sources.load_split(cfg.tasks, rollouts_needed(cfg))
  else:
    difficulties = list(cfg.tasks.difficulties)

    def make(count, offset):
      return [procgen.generate(str(dirs.repos), cfg.tasks.seed + offset + i,
                               difficulties[i % len(difficulties)]) for i in range(count)]

    train_tasks = make(cfg.tasks.train_count, 0)
    heldout = make(cfg.tasks.heldout_count, _HELDOUT_SEED_OFFSET)
  if cfg.rl.curriculum.sampling == "running":
    _save_tasks(train_tasks, dirs.train)
  else:
    dirs.pool().add((t.id, {"task": t.to_json()}) for t in train_tasks)
  _save_tasks(heldout, dirs.heldout)  # last: its presence says the tasks are built


def _save_tasks(tasks, path: pathlib.Path) -> None:
  tasks_lib.save_jsonl(tasks, str(path) + ".tmp")
  pathlib.Path(str(path) + ".tmp").rename(path)


def rollouts_needed(cfg) -> int:
  """Train prompts the run needs: each prompt is trained once (single epoch), unless a
  running curriculum draws them with replacement (then one is enough)."""
  if cfg.rl.curriculum.sampling == "running":
    return 1
  return int(cfg.learner.steps * cfg.learner.groups_per_step)


def _group_metrics(groups, step: int) -> dict[str, float]:
  info = [g.info for g in groups]
  solved = [s for i in info for s in i["solved"]]
  versions = np.concatenate([g_seg["versions"][g_seg["loss_mask"] > 0]
                             for g in groups for g_seg in g.segments])
  return {
      **_draft_metrics(info),
      "reward": float(np.mean([r for g in groups for r in g.rewards_G])),
      "pass_rate": float(np.mean(solved)),
      "tokens_per_rollout": float(np.mean([t for i in info for t in i["total_tokens"]])),
      "sampled_per_rollout": float(np.mean([t for i in info for t in i["sampled_tokens"]])),
      "turns": float(np.mean([t for i in info for t in i["turns"]])),
      # All pass or all fail: zero advantage, nothing learnt (a curriculum lowers it).
      "uniform_groups": float(np.mean([len(set(i["solved"])) == 1 for i in info])),
      "staleness_groups": float(np.mean([step - g.policy_version for g in groups])),
      "staleness_tokens": float(np.mean(step - versions)) if versions.size else 0.0,
  }


def _draft_metrics(info) -> dict[str, float]:
  """Speculative decoding over the step's groups (actors.num_draft_tokens > 0):
  draft_tokens_per_step, the tokens a sequence gained per verify step (1 + accepted drafts),
  and draft_acceptance, the fraction of drafted tokens accepted."""
  drafted = [i for i in info if "verify_steps" in i]
  steps = sum(i["verify_steps"] for i in drafted)
  if not steps:
    return {}
  accepted = sum(i["accepted_drafts"] for i in drafted)
  proposed = sum(i["verify_steps"] * i["draft_tokens"] for i in drafted)
  return {"draft_tokens_per_step": 1.0 + accepted / steps,
          "draft_acceptance": accepted / proposed}


class _Run:
  """The pieces of one learner incarnation."""

  def __init__(self, cfg, workdir):
    self.cfg = cfg
    self.dirs = rollouts.RunDirs(pathlib.Path(workdir).absolute())
    self.dirs.root.mkdir(parents=True, exist_ok=True)
    self.dirs.config.write_text(cfg.to_json())
    self.tokenizer = data.prepare_from_config(cfg.data, progress=False).tokenizer()
    build_tasks(cfg, self.dirs)
    self.pool, self.queue = self.dirs.pool(), self.dirs.queue(cfg)
    self.heldout = tasks_lib.load_jsonl(str(self.dirs.heldout))


def _recover(run, step: int, restored) -> None:
  """After a restore: groups trained after `step` back in the queue, prompts leased by
  the previous run's actors and groups refused as ahead of `step` back in the pool."""
  requeued = run.queue.recover(step if restored is not None else -1)
  returned = run.pool.requeue(None, finished=run.queue.contains)
  # Groups sampled by weights newer than the restored step were refused: re-roll them.
  reopened = run.pool.reopen(run.queue.refused_ids(), finished=run.queue.contains)
  if requeued or returned or reopened:
    print(f"rl: {requeued} group(s) back in the queue, {returned + reopened} prompt(s) "
          f"back in the pool ({reopened} refused as ahead of step {step})", flush=True)


def _take_groups(cfg, run, actors, step: int, feed, stop) -> list | None:
  """The step's groups, waiting (and checking on the actors, and keeping a running
  curriculum's draws coming) while the queue is short; None if a stop signal arrives
  meanwhile (groups already taken stay claimed: the resumed run's queue recovery puts
  them back in order)."""
  groups = []
  while len(groups) < cfg.learner.groups_per_step:
    try:
      groups.append(run.queue.get(step, timeout=cfg.learner.wait_s))
    except queue_lib.Empty:
      if stop.requested:
        return None
      actors.check(run.pool, run.queue)
      if feed is not None:
        feed.top_up()
      if actors.all_finished and run.queue.counts()["ready"] == 0:
        raise RuntimeError(
            f"The pool ran out of prompts at step {step} of {cfg.learner.steps}; "
            "add tasks (config.tasks.train_count) or lower learner.steps.") from None
  return groups


class _Lead:
  """Process 0's side of the learner: the actors, queue, weight publisher, metrics and
  held-out evaluation. `params` are the starting parameters as the leader reads them
  (c2jax.parallel.distributed.gather_for_leader)."""

  def __init__(self, cfg, run, step: int, params, restored_data):
    self.cfg, self.run = cfg, run
    # A fresh weight directory per incarnation: versions published after the checkpoint
    # we resumed from belong to a discarded future.
    weights_dir = rollouts.fresh_weights_dir(cfg, run.dirs, step)
    self.publisher = weights_lib.WeightPublisher(weights_dir, full_every=cfg.actors.full_every)
    self.publisher.publish(params, step, full=True)
    self.writer = metrics_lib.MetricsWriter(run.dirs.root, resume_step=step,
                                            metrics_cfg=cfg.metrics, config=cfg.to_dict())
    self.heldout = heldout_lib.HeldoutEval(cfg, run, self.writer, params, step)
    if cfg.eval.at_start and step == 0 and not (run.dirs.root / "eval0.done").exists():
      self.heldout(params, 0)
      (run.dirs.root / "eval0.done").touch()
    if step == 0:
      curriculum_pool.probe(cfg, run, self.heldout.engine_at(params, 0))
    self.feed = None
    if cfg.rl.curriculum.sampling == "running":
      self.feed = curriculum_pool.PoolFeed(cfg, run.dirs, run.pool)
      source = self.feed.start(restored_data)
      print(f"rl: running curriculum over {len(self.feed.tasks)} prompts, statistics from "
            f"{source}; {self.feed.top_up()} drawn", flush=True)
    else:
      run.pool.keep_open(False)  # e.g. left open by a killed run with sampling = 'running'
    self.actors = actors_lib.make_actors(cfg, run.dirs, weights_dir)
    self.timing = {"idle_s": 0.0, "eval_s": 0.0, "rollouts": 0}
    self.first_step = step
    self._groups, self._batch_metrics = [], {}

  def start(self) -> None:
    self.actors.start()
    self.actors.watch(self.run.pool, self.run.queue, self.cfg.actors.check_every_s)
    self.timing["started"] = time.monotonic()

  def _elapsed(self) -> float:
    return time.monotonic() - self.timing["started"] - self.timing["eval_s"]

  def take_batch(self, step: int, batch_ways: int, stop) -> dict | None:
    """The packed batch of the step's groups (waiting for them is idle time); None if
    stopped while waiting."""
    waited = time.monotonic()
    self._groups = _take_groups(self.cfg, self.run, self.actors, step, self.feed, stop)
    self.timing["idle_s"] += time.monotonic() - waited
    if self._groups is None:
      return None
    batch, self._batch_metrics = learner_runtime.build_batch(self.cfg, self._groups,
                                                             batch_ways)
    return batch

  def trained(self, step: int) -> dict:
    """Records the step's groups as trained at `step`; the host metrics of the step."""
    groups = self._groups
    self.run.queue.mark_trained([g.group_id for g in groups], step)
    curriculum_metrics = {}
    if self.feed is not None:
      curriculum_metrics = self.feed.observe(groups)
      self.feed.top_up()
    self.timing["rollouts"] += sum(len(g.rewards_G) for g in groups)
    elapsed = self._elapsed()
    return {**_group_metrics(groups, step - 1), **self._batch_metrics,
            "idle_fraction": self.timing["idle_s"] / max(elapsed, 1e-9),
            "stale_groups": self.run.queue.counts()["stale"], **infra.totals(self.run.dirs),
            "rollouts_per_s": self.timing["rollouts"] / max(elapsed, 1e-9),
            **curriculum_metrics}

  def data_state(self) -> dict:
    """What the checkpoint keeps beside the parameters: a running curriculum's statistics
    belong with the parameters they were trained with (restored together)."""
    return {"curriculum": self.feed.state()} if self.feed is not None else {}

  def report(self, at_step, step_metrics, extra):
    cfg = self.cfg
    scalars = {**step_metrics, **extra}
    self.writer.write(at_step, scalars)
    if at_step % cfg.learner.log_every == 0 or at_step == cfg.learner.steps:
      eta = self._elapsed() / max(at_step - self.first_step, 1) * (cfg.learner.steps - at_step)
      print(f"rl: step {at_step}/{cfg.learner.steps} reward {scalars['reward']:+.3f} "
            f"pass {scalars['pass_rate']:.2f} loss {scalars['loss']:+.4f} "
            f"staleness {scalars['staleness_groups']:.1f} idle "
            f"{scalars['idle_fraction']:.0%} {scalars['rollouts_per_s']:.2f} rollouts/s "
            f"eta {eta / 60:.1f} min", flush=True)
    return scalars

  def evaluate(self, params, step: int) -> None:
    self.timing["eval_s"] += self.heldout(params, step)

  def close(self) -> None:
    self.actors.stop()
    if self.feed is not None:
      self.feed.close()
    # Stopped actors' unfinished prompts wait in the pool for the next run.
    self.run.pool.requeue(None, finished=self.run.queue.contains)
    self.writer.close()

  def summary(self, step: int) -> dict:
    return {"step": step, "evals": self.heldout.results,
            "idle_fraction": self.timing["idle_s"] / max(self._elapsed(), 1e-9),
            "wall_s": time.monotonic() - self.timing["started"]}


class LeaderStoppedError(RuntimeError):
  """Process 0 of a multi-process learner stopped; the others stop with it."""


def _on_leader(work):
  """work() on process 0; if it fails, the other processes, which wait in the next
  batch broadcast meanwhile, are told to stop instead of waiting there for ever."""
  try:
    return work()
  except BaseException:
    if jax.process_count() > 1:
      distributed.broadcast_arrays(None)
    raise


_PREEMPTED = "__preempted__"  # the batch the leader sends when stopped while waiting


def _next_batch(lead, step: int, batch_ways: int, stop):
  """The step's batch on every process: process 0 takes the groups and packs them, the
  others receive them; None on every process when the leader was stopped by a signal
  while it waited for groups."""
  batch = None
  if lead is not None:
    batch = _on_leader(lambda: lead.take_batch(step, batch_ways, stop))
    if batch is None:
      batch = {_PREEMPTED: np.ones((), np.int32)}
  batch = distributed.broadcast_arrays(batch)
  if batch is None:
    raise LeaderStoppedError(f"rl: process 0 stopped at step {step}; its output says why.")
  return None if _PREEMPTED in batch else batch


def train(cfg, workdir) -> dict:
  """Runs (or resumes) the RL job in `workdir`; returns a summary.

  With several jax.distributed processes (config.parallel.distributed, or the JAX_*
  environment variables) every process calls this with the same config and workdir:
  process 0 leads (run directory, task pool, queue, actors, weight publishing, metrics,
  evals); every process restores, steps and checkpoints the sharded state, on the batch
  process 0 broadcasts."""
  # Multi-process learners join here, before anything asks JAX for its devices.
  distributed.initialize(cfg.parallel.distributed)
  # The policy's model is the one its init_from checkpoint trained (declared changes aside).
  cfg = model_source.resolve(cfg)
  job.validate(cfg, jax.device_count())
  dirs = rollouts.RunDirs(pathlib.Path(workdir).absolute())
  # A changed policy model on resume is named before anything is built or compiled.
  model_source.check_resume(cfg, rollouts.checkpoint_location(cfg, dirs))
  run = _Run(cfg, workdir) if distributed.is_leader() else None
  rt = learner_runtime.build(cfg)
  checkpointer = checkpoint_lib.Checkpointer(rollouts.checkpoint_location(cfg, dirs),
                                             keep=cfg.learner.keep_checkpoints,
                                             every=cfg.learner.checkpoint_every)
  step, state, ref_params, restored = learner_runtime.start(rt, checkpointer)
  if run is not None:
    if restored is not None:
      print(f"rl: resuming from step {step}"
            + (f" ({jax.process_count()} learner processes)" if jax.process_count() > 1
               else ""), flush=True)
    _recover(run, step, restored)
  lead, preempted = None, None
  if run is not None:
    preemption.clear(dirs.root)
  stop = preemption.StopRequest(jax_processes=True).install()
  try:
    host = distributed.gather_for_leader(state.params)
    if run is not None:
      lead = _on_leader(lambda: _Lead(
          cfg, run, step, host, restored[2] if restored is not None else None))
    step_fn = learner_runtime.make_step(rt)
    late = runtime.LateMetrics(
        lead.report if lead is not None else lambda at_step, metrics, extra: None,
        lambda at_step: (
            f"The last good checkpoint is step {max(checkpointer.steps(), default=0)} in "
            f"{checkpointer.directory}. Lower config.learner.learning_rate or check the "
            "rewards and advantages, then rerun."))
    if lead is not None:
      _on_leader(lead.start)
    saved = step if restored is not None else None

    def save():
      nonlocal saved
      late.flush()  # a non-finite loss stops the run before this step is saved
      # Only process 0 writes the JSON data slot (orbax), so the others pass {}.
      checkpointer.save(step, state, lead.data_state() if lead is not None else {},
                        {"config": json.loads(cfg.to_json())}, force=True)
      saved = step

    while step < cfg.learner.steps:
      batch = _next_batch(lead, step, rt.batch_ways(), stop)
      if batch is None:  # stopped while waiting for groups: nothing new to train
        if saved != step:
          save()
        preempted = step
        break
      with rt.scope():
        state, step_metrics = step_fn(state, ref_params, rt.place(batch))
      step += 1
      host = distributed.gather_for_leader(state.params)
      late.push(step, step_metrics, lead.trained(step) if lead is not None else {})
      if lead is not None:
        lead.publisher.publish(host, step)
      stopping = stop.reached(step)  # every process calls it once per step
      if (step % cfg.learner.checkpoint_every == 0 or step == cfg.learner.steps
          or stopping):
        save()
      if step % cfg.eval.every == 0 or step == cfg.learner.steps:
        late.flush()
        if lead is not None:
          lead.evaluate(host, step)
      if stopping and step < cfg.learner.steps:
        preempted = step
        break
    late.flush()
    if preempted is not None and lead is not None:
      preemption.mark(dirs.root, step=step)
      print(f"preemption: the learner stopped after step {step} with a checkpoint in "
            f"{checkpointer.directory}; rerun the same command to resume", flush=True)
  finally:
    stop.uninstall()
    if lead is not None:
      lead.close()
    checkpointer.close()
  if lead is None:
    return {"step": step, "process": jax.process_index(), "preempted": preempted}
  return {**lead.summary(step), "preempted": preempted}
