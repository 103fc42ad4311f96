"""`c2jax rl`: the learner loop, with its actors, queue, weight publishing and evals.

    summary = train(cfg, workdir)

Per step: take `learner.groups_per_step` finished groups from the queue (each within
`rl.queue.max_lag` versions of the learner), pack their segments into one batch, run the
jitted `rl_step`, record the groups as trained at this step, publish the new weights (a
delta) for the actors, checkpoint. Time spent waiting for groups is the learner's idle
time. Held-out evaluation (pass rate, best-of-k) runs at step 0 and every `eval.every`
steps with the learner's own engine.

Rerunning the same command resumes: the newest readable checkpoint gives the step and
state; groups trained after it go back to the queue (`GroupQueue.recover`), prompts
leased to actors of the previous run go back to the pool, and weights are republished
to a fresh directory, so no finished group is lost or trained twice.
"""

from __future__ import annotations

import functools
import json
import pathlib
import queue as queue_lib
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2jax import data, model
from c2jax.agent import loop as agent_loop
from c2jax.env import procgen
from c2jax.env import tasks as tasks_lib
from c2jax.eval import engine_policy
from c2jax.eval import runner as eval_runner
from c2jax.rl import actors as actors_lib
from c2jax.rl import curriculum as curriculum_lib
from c2jax.rl import infra, job, learner, packing, rollouts, task_sources
from c2jax.rl import weights as weights_lib
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import loop
from c2jax.train import metrics as metrics_lib
from c2jax.train import model_source
from c2jax.train import optimizer as optimizer_lib
from c2jax.train.step import TrainState

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


def learner_model_config(cfg):
  """The model config the learner runs: router replay filtered as config.rl says."""
  model_cfg = cfg.model.copy_and_resolve_references()
  replay = cfg.rl.router_replay
  model_cfg.moe.replay_filter_factor = float(replay.factor) if replay.filter else 0.0
  return model_cfg


def initial_params(cfg):
  """The policy RL starts from: cfg.init_from's newest checkpoint (an SFT run), or a
  random initialisation when init_from is '' (tests of the machinery)."""
  params = model.init(cfg.model, jax.random.PRNGKey(cfg.learner.seed))
  return loop.restore_init_params(cfg, params) if cfg.init_from else params


def build_batch(cfg, groups, num_ranks: int = 1) -> tuple[dict[str, np.ndarray], dict]:
  """One packed batch from the step's groups: rows balanced across `num_ranks`
  data-parallel ranks (rank-major), padded to a row count that changes only when the
  segments outgrow it (few compiles)."""
  segments, advantages = [], []
  for group in groups:
    for segment, chain in zip(group.segments, group.segment_chain_S):
      segments.append(segment)
      advantages.append(group.advantages_G[chain])
  unit = rollouts_per_step(cfg)
  rows = -(-len(segments) // unit) * unit
  batch, pack_metrics = packing.pack_batch(
      segments, advantages, num_ranks, cfg.actors.max_length, cfg.rl.packing.attention_cost,
      rows_per_rank=-(-rows // num_ranks))
  return {name: batch[name] for name in learner.BATCH_FIELDS}, dict(
      pack_metrics, rows=len(batch["tokens"]), segments=len(segments))


def rollouts_per_step(cfg) -> int:
  """Rollouts the learner trains on per step: the `constant` loss normaliser's count."""
  return int(cfg.learner.groups_per_step * cfg.rl.group_size)


def data_parallel_mesh() -> jax.sharding.Mesh:
  """Every local device as one data-parallel axis: the learner's parameters are
  replicated and each device takes its rank's rows of the packed batch."""
  return jax.sharding.Mesh(np.asarray(jax.devices()), ("data",))


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
      "reward": float(np.mean([r for g in groups for r in g.rewards_G])),
      "pass_rate": float(np.mean(solved)),
      "tokens_per_rollout": float(np.mean([t for i in info for t in i["total_tokens"]])),
      "sampled_per_rollout": float(np.mean([t for i in info for t in i["sampled_tokens"]])),
      "turns": float(np.mean([t for i in info for t in i["turns"]])),
      "staleness_groups": float(np.mean([step - g.policy_version for g in groups])),
      "staleness_tokens": float(np.mean(step - versions)) if versions.size else 0.0,
  }


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


def train(cfg, workdir) -> dict:
  # The policy's model is the one its init_from checkpoint trained (declared changes aside).
  cfg = model_source.resolve(cfg)
  job.validate(cfg)
  run = _Run(cfg, workdir)
  model_cfg = learner_model_config(cfg)
  params = initial_params(cfg)
  optimizer, _ = optimizer_lib.make_optimizer(
      learning_rate=cfg.learner.learning_rate, total_steps=cfg.learner.steps,
      warmup_steps=cfg.learner.warmup_steps, weight_decay=0.0, end_lr_fraction=1.0,
      b1=cfg.learner.b1, b2=cfg.learner.b2, clip_norm=cfg.learner.clip_norm,
      state_dtype=cfg.model.opt_state_dtype)
  state = TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))
  # Copies: the step donates the state's buffers.
  ref_params = jax.tree.map(jnp.copy, params) if cfg.rl.kl.coef > 0 else None
  checkpointer = checkpoint_lib.Checkpointer(run.dirs.checkpoints,
                                             keep=cfg.learner.keep_checkpoints,
                                             every=cfg.learner.checkpoint_every)
  mesh = data_parallel_mesh()
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  by_rank = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  restored = checkpointer.restore_latest(checkpoint_lib.abstract_like(state))
  step = 0
  if restored is not None:
    step, state, _ = restored
    print(f"rl: resuming from step {step}", flush=True)
  state, ref_params = jax.device_put((state, ref_params), replicated)
  requeued = run.queue.recover(step if restored is not None else -1)
  returned = run.pool.requeue(None, finished=run.queue.contains)
  # Groups sampled by weights newer than the restored step were refused: re-roll them.
  reopened = run.pool.reopen(run.queue.refused_ids(), finished=run.queue.contains)
  if requeued or returned or reopened:
    print(f"rl: {requeued} group(s) back in the queue, {returned + reopened} prompt(s) "
          f"back in the pool ({reopened} refused as ahead of step {step})", flush=True)

  # A fresh weight directory per incarnation: versions published after the checkpoint
  # we resumed from belong to a discarded future.
  shutil.rmtree(run.dirs.weights, ignore_errors=True)
  weights_dir = run.dirs.weights / f"from-step-{step:06d}"
  publisher = weights_lib.WeightPublisher(str(weights_dir), full_every=cfg.actors.full_every)
  publisher.publish(state.params, step, full=True)

  writer = metrics_lib.MetricsWriter(run.dirs.root, resume_step=step)
  from c2jax.rollout import JaxEngine  # pylint: disable=g-import-not-at-top

  eval_engine = JaxEngine(cfg.model, jax.tree.map(jnp.copy, state.params), num_slots=cfg.eval.slots,
                          max_length=cfg.actors.max_length, version=step)
  evals = {}

  eval_agent = cfg.agent.copy_and_resolve_references()
  eval_agent.temperature = cfg.eval.temperature
  eval_policy = engine_policy.EnginePolicy(eval_engine, run.tokenizer, eval_agent, "rl")

  def run_eval(at_step):
    """Held-out evaluation through the eval harness (c2jax.eval): one implementation;
    each step's results land in evals/step_N/ (resumable, `c2jax eval report`-able)."""
    eval_engine.update_params(jax.tree.map(jnp.copy, state.params), at_step)
    started = time.monotonic()
    summary = eval_runner.evaluate_tasks(
        eval_policy, run.heldout, run.dirs.root / "evals" / f"step_{at_step:06d}",
        samples=cfg.eval.samples, ks=(1, cfg.eval.samples), seed=cfg.learner.seed,
        suite_name="heldout", progress=False)["overall"]
    result = {"pass_rate": summary["accuracy"],
              f"best_of_{cfg.eval.samples}": summary[f"best_of_{cfg.eval.samples}"],
              f"pass@{cfg.eval.samples}": summary[f"pass@{cfg.eval.samples}"],
              "tokens_per_rollout": summary["completion_tokens"]["mean"],
              "turns": summary["turns"]["mean"],
              "infra_errors": summary["infra_errors"],
              "seconds": time.monotonic() - started}
    result = {k: float("nan") if v is None else float(v) for k, v in result.items()}
    evals[at_step] = result
    writer.write(at_step, {f"eval/{k}": v for k, v in result.items()})
    print(f"rl: eval at step {at_step}: " + ", ".join(
        f"{k} {v:.3f}" for k, v in result.items()), flush=True)
    return result["seconds"]

  if cfg.eval.at_start and step == 0 and not (run.dirs.root / "eval0.done").exists():
    run_eval(0)
    (run.dirs.root / "eval0.done").touch()

  if step == 0:
    eval_engine.update_params(jax.tree.map(jnp.copy, state.params), 0)
    probe_curriculum(cfg, run, eval_engine)
  step_fn = jax.jit(functools.partial(learner.rl_step, cfg.rl, model_cfg, optimizer,
                                      rollouts_per_step=rollouts_per_step(cfg),
                                      temperature=float(cfg.agent.temperature)),
                    donate_argnums=(0,))
  actors = actors_lib.make_actors(cfg, run.dirs, weights_dir)
  actors.start()
  started, idle_s, eval_s, rollouts_done = time.monotonic(), 0.0, 0.0, 0
  try:
    while step < cfg.learner.steps:
      waited = time.monotonic()
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
      idle_s += time.monotonic() - waited
      batch, batch_metrics = build_batch(cfg, groups, mesh.size)
      batch = jax.device_put(batch, by_rank)
      state, step_metrics = step_fn(state, ref_params, batch)
      step_metrics = jax.device_get(step_metrics)
      step += 1
      run.queue.mark_trained([g.group_id for g in groups], step)
      publisher.publish(state.params, step)
      checkpointer.save(step, state, {}, {"config": json.loads(cfg.to_json())},
                        force=step == cfg.learner.steps)
      rollouts_done += sum(len(g.rewards_G) for g in groups)
      elapsed = time.monotonic() - started - eval_s
      scalars = {**{k: float(v) for k, v in step_metrics.items()},
                 **_group_metrics(groups, step - 1), **batch_metrics,
                 "idle_fraction": idle_s / max(elapsed, 1e-9),
                 "stale_groups": run.queue.counts()["stale"],
                 **infra.totals(run.dirs),
                 "rollouts_per_s": rollouts_done / max(elapsed, 1e-9)}
      writer.write(step, scalars)
      if step % cfg.learner.log_every == 0 or step == cfg.learner.steps:
        eta = elapsed / step_count(step, restored) * (cfg.learner.steps - step)
        print(f"rl: step {step}/{cfg.learner.steps} reward {scalars['reward']:+.3f} "
              f"pass {scalars['pass_rate']:.2f} loss {scalars['loss']:+.4f} "
              f"staleness {scalars['staleness_groups']:.1f} idle "
              f"{scalars['idle_fraction']:.0%} {scalars['rollouts_per_s']:.2f} rollouts/s "
              f"eta {eta / 60:.1f} min", flush=True)
      if step % cfg.eval.every == 0 or step == cfg.learner.steps:
        eval_s += run_eval(step)
  finally:
    actors.stop()
    # Stopped actors' unfinished prompts wait in the pool for the next run.
    run.pool.requeue(None, finished=run.queue.contains)
    checkpointer.close()
    writer.close()
  elapsed = time.monotonic() - started - eval_s
  return {"step": step, "evals": evals, "idle_fraction": idle_s / max(elapsed, 1e-9),
          "wall_s": time.monotonic() - started}


def step_count(step: int, restored) -> int:
  """Steps run by this incarnation (for the ETA)."""
  first = restored[0] if restored is not None else 0
  return max(step - first, 1)
