"""`c2jax rl`: the learner loop, with its actors, queue, weight publishing and evals.

    summary = train(cfg, workdir)

Per step: take `learner.groups_per_step` finished groups from the queue (each within
`rl.queue.max_lag` versions of the learner), pack their segments into one batch, run the
jitted `rl_step`, record the groups as trained at this step, publish the new weights (a
delta) for the actors, checkpoint. The learner runs on the shared training runtime
(c2jax.rl.learner_runtime): sharded as config.parallel says, metrics read one step late,
a non-finite loss stops the run naming the step before anything is saved. Time spent
waiting for groups is the learner's idle time. Held-out evaluation (pass rate, best-of-k) runs at step 0 and every `eval.every`
steps with the learner's own engine.

Rerunning the same command resumes: the newest readable checkpoint gives the step and
state; groups trained after it go back to the queue (`GroupQueue.recover`), prompts
leased to actors of the previous run go back to the pool, and weights are republished
to a fresh directory, so no finished group is lost or trained twice.
"""

from __future__ import annotations

import json
import pathlib
import queue as queue_lib
import time

import jax
import numpy as np

from c2jax import data
from c2jax.agent import loop as agent_loop
from c2jax.env import procgen
from c2jax.env import tasks as tasks_lib
from c2jax.parallel import distributed
from c2jax.rl import actors as actors_lib
from c2jax.rl import curriculum as curriculum_lib
from c2jax.rl import heldout as heldout_lib
from c2jax.rl import infra, job, learner_runtime, rollouts, task_sources
from c2jax.rl import weights as weights_lib
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import metrics as metrics_lib
from c2jax.train import model_source, runtime

_HELDOUT_SEED_OFFSET = 1_000_000  # held-out repositories never share a seed with training


def build_tasks(cfg, dirs: rollouts.RunDirs) -> None:
  """Generates the train prompts into the pool and the held-out tasks (once per run)."""
  if dirs.heldout.exists():
    return
  if cfg.tasks.source != "procgen":
    train_tasks, heldout = task_sources.load_split(cfg.tasks, rollouts_needed(cfg))
    dirs.heldout.parent.mkdir(parents=True, exist_ok=True)
    dirs.pool().add((t.id, {"task": t.to_json()}) for t in train_tasks)
    tasks_lib.save_jsonl(heldout, str(dirs.heldout) + ".tmp")
    pathlib.Path(str(dirs.heldout) + ".tmp").rename(dirs.heldout)
    return
  difficulties = list(cfg.tasks.difficulties)

  def make(count, offset):
    return [procgen.generate(str(dirs.repos), cfg.tasks.seed + offset + i,
                             difficulties[i % len(difficulties)]) for i in range(count)]

  train_tasks = make(cfg.tasks.train_count, 0)
  dirs.pool().add((t.id, {"task": t.to_json()}) for t in train_tasks)
  heldout = make(cfg.tasks.heldout_count, _HELDOUT_SEED_OFFSET)
  tasks_lib.save_jsonl(heldout, str(dirs.heldout) + ".tmp")
  pathlib.Path(str(dirs.heldout) + ".tmp").rename(dirs.heldout)


def rollouts_needed(cfg) -> int:
  """Train prompts the run consumes: each prompt is trained once (single epoch)."""
  return int(cfg.learner.steps * cfg.learner.groups_per_step)


def curriculum_order(task_ids, observations, curriculum_cfg, seed: int) -> list[str]:
  """Every prompt, hard ones (more turns / thinking tokens in `observations`, tuples of
  (task_id, turns, thinking_tokens)) drawn earlier as config.rl.curriculum says."""
  sampler = curriculum_lib.CurriculumSampler(
      task_ids, curriculum_cfg.strength, curriculum_cfg.turns_weight,
      curriculum_cfg.thinking_weight, seed)
  for task_id, turns, thinking in observations:
    sampler.observe(task_id, turns, thinking)
  return sampler.draw(len(task_ids))


def probe_curriculum(cfg, run, engine) -> None:
  """Rolls out every pending prompt with the starting policy and reorders the pool by
  difficulty (once per run; see config.rl.curriculum)."""
  marker = run.dirs.root / "curriculum.json"
  curriculum = cfg.rl.curriculum
  if curriculum.strength <= 0 or marker.exists():
    return
  pending = run.pool.pending_tasks()
  tasks = [tasks_lib.Task.from_json(payload["task"]) for _, payload in pending]
  samples = curriculum.probe_samples
  jobs = [task for task in tasks for _ in range(samples)]
  seeds = [s for task in tasks for s in rollouts.rollout_seeds("probe:" + task.id, samples)]
  started = time.monotonic()
  trajectories = agent_loop.run_episodes(engine, run.tokenizer, cfg.agent, jobs, seeds=seeds)
  observations = [(t.task_id, t.stats.turns, t.stats.thinking_tokens) for t in trajectories]
  order = curriculum_order([task_id for task_id, _ in pending], observations, curriculum,
                           cfg.learner.seed)
  run.pool.reorder(order)
  marker.write_text(json.dumps({"order": order, "seconds": time.monotonic() - started}))
  print(f"rl: curriculum over {len(order)} prompts from {len(trajectories)} probe rollouts "
        f"({time.monotonic() - started:.0f}s)", flush=True)


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


def _take_groups(cfg, run, actors, step: int) -> list:
  """The step's groups, waiting (and checking on the actors) while the queue is short."""
  groups = []
  while len(groups) < cfg.learner.groups_per_step:
    try:
      groups.append(run.queue.get(step, timeout=cfg.learner.wait_s))
    except queue_lib.Empty:
      actors.check(run.pool, run.queue)
      if actors.all_finished and run.queue.counts()["ready"] == 0:
        raise RuntimeError(
            f"The pool ran out of prompts at step {step} of {cfg.learner.steps}; "
            "add tasks (config.tasks.train_count) or lower learner.steps.") from None
  return groups


def train(cfg, workdir) -> dict:
  # Multi-process learners join here, before anything asks JAX for its devices.
  distributed.initialize(cfg.parallel.distributed)
  if jax.process_count() > 1:
    raise RuntimeError(
        f"c2jax rl joined {jax.process_count()} processes, but its queue, actors, weight "
        "publisher and evals run in one process; run the learner as one process over its "
        "local devices (unset parallel.distributed / JAX_COORDINATOR_ADDRESS). The "
        "multi-process learner step itself is c2jax.rl.learner_runtime.")
  # The policy's model is the one its init_from checkpoint trained (declared changes aside).
  cfg = model_source.resolve(cfg)
  job.validate(cfg, jax.device_count())
  run = _Run(cfg, workdir)
  rt = learner_runtime.build(cfg)
  checkpointer = checkpoint_lib.Checkpointer(rollouts.checkpoint_location(cfg, run.dirs),
                                             keep=cfg.learner.keep_checkpoints,
                                             every=cfg.learner.checkpoint_every)
  step, state, ref_params, restored = learner_runtime.start(rt, checkpointer)
  if restored is not None:
    print(f"rl: resuming from step {step}", flush=True)
  _recover(run, step, restored)

  # A fresh weight directory per incarnation: versions published after the checkpoint
  # we resumed from belong to a discarded future.
  weights_dir = rollouts.fresh_weights_dir(cfg, run.dirs, step)
  publisher = weights_lib.WeightPublisher(weights_dir, full_every=cfg.actors.full_every)
  publisher.publish(state.params, step, full=True)

  writer = metrics_lib.MetricsWriter(run.dirs.root, resume_step=step)
  heldout = heldout_lib.HeldoutEval(cfg, run, writer, state.params, step)
  if cfg.eval.at_start and step == 0 and not (run.dirs.root / "eval0.done").exists():
    heldout(state.params, 0)
    (run.dirs.root / "eval0.done").touch()
  if step == 0:
    probe_curriculum(cfg, run, heldout.engine_at(state.params, 0))

  step_fn = learner_runtime.make_step(rt)
  actors = actors_lib.make_actors(cfg, run.dirs, weights_dir)
  actors.start()
  timing = {"started": time.monotonic(), "idle_s": 0.0, "eval_s": 0.0, "rollouts": 0}
  first_step = step

  def report(at_step, step_metrics, extra):
    scalars = {**step_metrics, **extra}
    writer.write(at_step, scalars)
    if at_step % cfg.learner.log_every == 0 or at_step == cfg.learner.steps:
      elapsed = time.monotonic() - timing["started"] - timing["eval_s"]
      eta = elapsed / max(at_step - first_step, 1) * (cfg.learner.steps - at_step)
      print(f"rl: step {at_step}/{cfg.learner.steps} reward {scalars['reward']:+.3f} "
            f"pass {scalars['pass_rate']:.2f} loss {scalars['loss']:+.4f} "
            f"staleness {scalars['staleness_groups']:.1f} idle "
            f"{scalars['idle_fraction']:.0%} {scalars['rollouts_per_s']:.2f} rollouts/s "
            f"eta {eta / 60:.1f} min", flush=True)
    return scalars

  late = runtime.LateMetrics(report, lambda at_step: (
      f"The last good checkpoint is step {max(checkpointer.steps(), default=0)} in "
      f"{checkpointer.directory}. Lower config.learner.learning_rate or check the "
      "rewards and advantages, then rerun."))
  try:
    while step < cfg.learner.steps:
      waited = time.monotonic()
      groups = _take_groups(cfg, run, actors, step)
      timing["idle_s"] += time.monotonic() - waited
      batch, batch_metrics = learner_runtime.build_batch(cfg, groups, rt.batch_ways())
      with rt.scope():
        state, step_metrics = step_fn(state, ref_params, rt.place(batch))
      step += 1
      run.queue.mark_trained([g.group_id for g in groups], step)
      timing["rollouts"] += sum(len(g.rewards_G) for g in groups)
      elapsed = time.monotonic() - timing["started"] - timing["eval_s"]
      late.push(step, step_metrics, {
          **_group_metrics(groups, step - 1), **batch_metrics,
          "idle_fraction": timing["idle_s"] / max(elapsed, 1e-9),
          "stale_groups": run.queue.counts()["stale"], **infra.totals(run.dirs),
          "rollouts_per_s": timing["rollouts"] / max(elapsed, 1e-9)})
      publisher.publish(state.params, step)
      if step % cfg.learner.checkpoint_every == 0 or step == cfg.learner.steps:
        late.flush()  # a non-finite loss stops the run before this step is saved
        checkpointer.save(step, state, {}, {"config": json.loads(cfg.to_json())},
                          force=True)
      if step % cfg.eval.every == 0 or step == cfg.learner.steps:
        late.flush()
        timing["eval_s"] += heldout(state.params, step)
    late.flush()
  finally:
    actors.stop()
    # Stopped actors' unfinished prompts wait in the pool for the next run.
    run.pool.requeue(None, finished=run.queue.contains)
    checkpointer.close()
    writer.close()
  elapsed = time.monotonic() - timing["started"] - timing["eval_s"]
  return {"step": step, "evals": heldout.results,
          "idle_fraction": timing["idle_s"] / max(elapsed, 1e-9),
          "wall_s": time.monotonic() - timing["started"]}
