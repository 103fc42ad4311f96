"""Process 0's side of `c2jax rl` (c2jax.rl.trainer): the run's tasks, task pool and
queue (`Run`), taking each step's groups from the queue while watching the actors
(`take_groups`), and `Lead`: the actors, the weight publisher, the metrics, the held-out
evaluation and a running curriculum's pool feed.

Host spans on a profile's timeline (c2jax.train.profiling): learner/wait is the time
spent waiting for the queue, learner/publish the weight delta for the actors.
"""

from __future__ import annotations

import pathlib
import queue as queue_lib
import time

import numpy as np

from c2jax import data
from c2jax.env import procgen
from c2jax.env import tasks as tasks_lib
from c2jax.rl.actors import backends as actors_lib
from c2jax.rl.actors import infra
from c2jax.rl.actors import rollouts
from c2jax.rl import heldout as heldout_lib
from c2jax.rl.learner import runtime as learner_runtime
from c2jax.rl.tasks import curriculum_pool
from c2jax.rl.tasks import task_sources
from c2jax.rollout import weights as weights_lib
from c2jax.train import metrics as metrics_lib
from c2jax.train import profiling

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


def group_metrics(groups, step: int) -> dict[str, float]:
  info = [g.info for g in groups]
  solved = [s for i in info for s in i["solved"]]
  versions = np.concatenate([g_seg["versions"][g_seg["loss_mask"] > 0]
                             for g in groups for g_seg in g.segments])
  return {
      **draft_metrics(info),
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


def draft_metrics(info) -> dict[str, float]:
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


class Run:
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


def recover(run, step: int, restored) -> None:
  """After a restore: groups trained after `step` back in the queue, prompts leased by
  the previous run's actors and groups refused as ahead of `step` back in the pool."""
  requeued = run.queue.recover(step if restored is not None else -1)
  returned = run.pool.requeue(None, finished=run.queue.contains)
  # Groups sampled by weights newer than the restored step were refused: re-roll them.
  reopened = run.pool.reopen(run.queue.refused_ids(), finished=run.queue.contains)
  if requeued or returned or reopened:
    print(f"rl: {requeued} group(s) back in the queue, {returned + reopened} prompt(s) "
          f"back in the pool ({reopened} refused as ahead of step {step})", flush=True)


def take_groups(cfg, run, actors, step: int, feed, stop) -> list | None:
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


class Lead:
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
    with profiling.span("learner/wait"):
      self._groups = take_groups(self.cfg, self.run, self.actors, step, self.feed, stop)
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
    return {**group_metrics(groups, step - 1), **self._batch_metrics,
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
            f"mismatch {scalars['mismatch_mean']:.2g} (p99 {scalars['mismatch_p99']:.2g}) "
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
