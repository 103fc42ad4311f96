"""The RL learner on the shared training runtime (c2jax.train.runtime).

    rt = learner_runtime.build(cfg)                  # mesh, rules, shardings, optimizer
    state, ref_params, restored = learner_runtime.start(rt, checkpointer)
    step_fn = learner_runtime.make_step(rt)
    batch, batch_metrics = learner_runtime.build_batch(cfg, groups, rt.batch_ways())
    with rt.scope():
      state, metrics = step_fn(state, ref_params, rt.place(batch))

The learner's parameters and Adam moments are sharded exactly as pretraining shards them
(config.parallel: FSDP, expert and context parallelism, multi-process meshes), the state is
donated, and the optimizer carries the same precision policy (fp32 masters, moments in
model.opt_state_dtype). The packed batch is split over the devices of the 'batch' rule
(one balanced rank of rows each) and, under context parallelism, along the sequence in
contiguous shards: the learner reads token t's log-prob at t - 1, a shift along the
sequence that needs the original token order (config.parallel.context_load_balance must
be False; c2jax.rl.job.validate says so).
"""

from __future__ import annotations

import functools

import jax

from c2jax import model as model_lib
from c2jax.model import mtp as mtp_lib
from c2jax.rl.learner import step as learner
from c2jax.rl.learner import packing
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import init_params, runtime
from c2jax.train import optimizer as optimizer_lib


def model_config(cfg):
  """The model config the learner runs: router replay filtered as config.rl says."""
  model_cfg = cfg.model.copy_and_resolve_references()
  replay = cfg.rl.router_replay
  model_cfg.moe.replay_filter_factor = float(replay.factor) if replay.filter else 0.0
  return model_cfg


def clip_group(path) -> str:
  """The policy and its MTP heads are clipped each by its own gradient norm, so the heads'
  online distillation (c2jax.rl.learner.mtp_distill) never scales the policy's update."""
  return "mtp" if getattr(path[0], "key", None) == mtp_lib.PARAMS_KEY else "policy"


def make_optimizer(cfg):
  """Adam over config.learner: constant learning rate after warm-up, no weight decay (the
  policy should stay near where SFT left it), moments in model.opt_state_dtype,
  learner.clip_norm applied to the policy and to its MTP heads separately, the heads'
  learning rate scaled by rl.mtp_lr_scale."""
  optimizer, _ = optimizer_lib.make_optimizer(
      learning_rate=cfg.learner.learning_rate, total_steps=cfg.learner.steps,
      warmup_steps=cfg.learner.warmup_steps, weight_decay=0.0, end_lr_fraction=1.0,
      b1=cfg.learner.b1, b2=cfg.learner.b2, clip_norm=cfg.learner.clip_norm,
      state_dtype=cfg.model.opt_state_dtype, clip_group=clip_group,
      group_lr_scale={"mtp": float(cfg.rl.mtp_lr_scale)})
  return optimizer


def build(cfg, devices=None) -> runtime.Runtime:
  """The learner's runtime for a validated RL job config (c2jax.rl.job.validate), on
  `devices` (default: all of this process's)."""
  return runtime.build_runtime(cfg, optimizer=make_optimizer(cfg),
                               model_cfg=model_config(cfg), seed=cfg.learner.seed,
                               devices=devices)


def rollouts_per_step(cfg) -> int:
  """Rollouts the learner trains on per step: the `constant` loss normaliser's count."""
  return int(cfg.learner.groups_per_step * cfg.rl.group_size)


def make_step(rt: runtime.Runtime):
  """`rl_step(state, ref_params, batch)` jitted on the runtime: state donated and kept in
  its shardings, the reference policy in the parameters' shardings."""
  cfg = rt.cfg
  step = functools.partial(learner.rl_step, cfg.rl, rt.model_cfg, rt.optimizer,
                           rollouts_per_step=rollouts_per_step(cfg),
                           temperature=float(cfg.agent.temperature),
                           microbatches=cfg.learner.microbatches)
  ref = rt.state_shardings.params if cfg.rl.kl.coef > 0 else None
  return rt.jit_step(step, extra=(ref,), batch_shardings=batch_shardings(rt))


# The rank of each packed-batch field (c2jax.rl.learner.step's batch layout).
FIELD_RANKS = {"tokens": 2, "valid": 2, "loss_mask": 2, "sampler_logprobs": 2,
               "router_indices": 4, "advantages": 1}


def batch_shardings(rt: runtime.Runtime) -> dict:
  return rt.batch_shardings({name: FIELD_RANKS[name] for name in learner.BATCH_FIELDS})


def start(rt: runtime.Runtime, checkpointer: checkpoint_lib.Checkpointer):
  """(step, state, ref_params, restored): the newest checkpoint if any (placed in the
  runtime's shardings), else the parameters of config.init_from (random when it is '');
  ref_params is a frozen copy of the starting policy for the KL term (None without KL):
  on a resume past step 0 it is read again from init_from, not taken from the restored
  step, so a resumed run keeps the KL anchor of the uninterrupted one."""
  with rt.scope():
    restored = checkpointer.restore_latest(runtime.abstract_state(rt))
  if restored is None:
    step, state = 0, init_params.initial_params(rt, runtime.init_state(rt))
  else:
    step, state, _ = restored
  ref_params = None
  if rt.cfg.rl.kl.coef > 0:
    ref_params = (_starting_params(rt) if step > 0
                  else runtime.copy_params(rt, state.params))
  return step, state, ref_params, restored


def _starting_params(rt: runtime.Runtime):
  """The policy at step 0: config.init_from's parameters (or the seeded random init, as
  runtime.init_state draws it), placed in the runtime's shardings; no optimizer state."""
  shardings = rt.state_shardings.params
  with rt.scope():
    fresh = jax.jit(lambda rng: model_lib.init(rt.model_cfg, rng),
                    out_shardings=shardings)(jax.random.key(rt.seed))
    if rt.cfg.init_from:
      fresh = init_params.restore_init_params(rt.cfg, fresh, shardings)
  return fresh


def batch_rows(cfg, segments: int, num_ranks: int) -> int:
  """Rows of the packed batch that holds `segments` segments: a multiple of the step's
  rollouts (a count that changes only when the segments outgrow it: few compiles), in
  equal rank shares that each split into learner.microbatches microbatches."""
  unit, micro = rollouts_per_step(cfg), cfg.learner.microbatches
  rows = -(-segments // unit) * unit
  per_rank = -(-rows // num_ranks)
  return -(-per_rank // micro) * micro * num_ranks


def build_batch(cfg, groups, num_ranks: int = 1):
  """One packed batch from the step's groups: rows balanced across `num_ranks`
  data-parallel ranks (rank-major), padded to `batch_rows`."""
  segments, advantages = [], []
  for group in groups:
    for segment, chain in zip(group.segments, group.segment_chain_S):
      segments.append(segment)
      advantages.append(group.advantages_G[chain])
  batch, pack_metrics = packing.pack_batch(
      segments, advantages, num_ranks, cfg.actors.max_length, cfg.rl.packing.attention_cost,
      rows_per_rank=batch_rows(cfg, len(segments), num_ranks) // num_ranks)
  return {name: batch[name] for name in learner.BATCH_FIELDS}, dict(
      pack_metrics, rows=len(batch["tokens"]), segments=len(segments))
