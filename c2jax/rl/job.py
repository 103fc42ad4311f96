"""The RL job config: sections, defaults and validation (configs/rl.py builds on these).

  model     the policy's architecture: inherited from the checkpoint in init_from, except
            implementation keys and those listed in model_changes (c2jax/model/lineage.py)
  data      the data section of the phase the policy came from: it names the tokenizer
  init_from the SFT run directory whose newest checkpoint starts RL ('' = random init,
            for tests of the machinery)
  rl        losses, advantages, rewards, queue (c2jax.rl.config)
  agent     the agent loop (c2jax.agent.config)
  learner   the optimizer and step schedule
  actors    rollout actors: how many, their engine (and its device mesh,
            actors.parallel), how they sync weights
  tasks     the task source (c2jax.rl.tasks.task_sources): procedural repositories, or tasks
            loaded from `path` (a revert_restore / built suite / SWE-bench JSONL, Harbor
            folders), split into train and held-out
  eval      the held-out evaluation: pass rate and best-of-k
  parallel  the learner's mesh and logical rules, as in pretraining (c2jax.parallel):
            FSDP, expert and context parallelism, multi-process over jax.distributed
"""

from __future__ import annotations

import math

import ml_collections

from c2jax import config as configlib
from c2jax import data, parallel, storage
from c2jax.agent import config as agent_config
from c2jax.model import config as model_config
from c2jax.model import lineage, variants
from c2jax.parallel import context
from c2jax.rl import config as rl_config
from c2jax.rollout import sharding as engine_sharding
from c2jax.train import accumulate
from c2jax.train import metrics as train_metrics
from c2jax.train import profiling

def job_defaults(variant: str = "tiny") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.task = "rl"
  c.model = variants.get(variant)
  c.data = data.default_config()
  c.data.vocab_size = c.model.vocab_size
  c.init_from = ""
  # Model keys RL changes on purpose (dotted); the rest is inherited from init_from.
  c.model_changes = ()
  c.rl = rl_config.default_config()
  c.agent = agent_config.default_config()
  c.learner = ml_collections.ConfigDict(dict(
      seed=0, steps=20, learning_rate=1e-5, warmup_steps=0, b1=0.9, b2=0.999, clip_norm=1.0,
      groups_per_step=2, checkpoint_every=5, keep_checkpoints=3, log_every=1,
      # Gradient accumulation: the packed batch runs as this many sequential microbatches
      # (one update, the whole batch's loss; c2jax.train.accumulate).
      microbatches=1,
      # Seconds to wait for a group before checking on the actors again.
      wait_s=1.0,
      # Where checkpoints go: '' = <workdir>/checkpoints, or a path or orbax URL
      # (gs://, s3://, file://; c2jax.storage).
      checkpoint_dir=""))
  c.actors = ml_collections.ConfigDict(dict(
      count=2, backend="process", slots=8, max_length=1024, weight_poll_s=0.5,
      full_every=16, restarts=3,
      # Seconds between the learner's checks on its actors, whatever the queue holds: a
      # dead actor is restarted (its leased prompts back in the pool) within this time.
      check_every_s=2.0,
      # > 0: actors decode speculatively, the policy's first MTP module drafting this many
      # tokens per verify step (c2jax.rollout.speculative); needs model.num_mtp_layers > 0.
      # The sampled distribution and the recorded log-probs are the policy's either way.
      num_draft_tokens=0,
      # Each engine holds the routed experts quantised ('fp8', 'int8', 'int4'; 'none':
      # the published dtype), quantising every published version itself, so it samples
      # from exactly quantise(learner weights); rl: step's mismatch_* metrics measure it.
      weights_quant="none",
      # JAX processes per actor: > 1 runs each actor's engine over that many processes'
      # devices (jax.distributed among them; actors.parallel spans them), process 0
      # rolling out and the others following its engine; if one dies, the whole actor
      # restarts and its leased prompt returns to the pool. Process backend: child
      # processes; Ray: that many tasks of one CPU each, on any nodes.
      processes=1,
      # With processes > 1: seconds a program or weight swap of the actor's engine may take
      # (its first, compiling call aside) before a process that holds it up is named and
      # the actor exits, to be restarted whole (c2jax.rollout.lockstep.Watchdog).
      hang_timeout_s=600.0,
      # Where published weights go: '' = <workdir>/weights, or a tensorstore URL
      # (gs://, s3://, file://) every actor can read; Ray actors on other machines need one.
      weights_dir=""))
  # Each actor's engine mesh over its own process's devices (c2jax.rollout.sharding):
  # all axes 1 is one device; e.g. actors.parallel.mesh.fsdp=8 shards it over 8.
  c.actors.parallel = engine_sharding.engine_parallel_defaults()
  # packages_dir: where a suite built from released packages has its packages and
  # instance checkouts made ('' = ~/.cache/c2jax/packages; c2jax/env/packages).
  # build_images (source 'harbor', agent.backend 'docker'): each task folder's Dockerfile
  # is built by the docker engine and its episodes run in that image (c2jax/env/images.py;
  # base_images: 'FROM=LOCAL_IMAGE' entries ahead of its base-image table).
  c.tasks = ml_collections.ConfigDict(dict(
      source="procgen", difficulties=(1, 2, 3, 4), train_count=64, heldout_count=16,
      seed=0, path="", repos_root="", packages_dir="", build_images=False,
      base_images=()))
  # at_start: evaluate the starting policy before the first step (the baseline).
  c.eval = ml_collections.ConfigDict(dict(every=10, samples=4, temperature=1.0, slots=16,
                                          at_start=True))
  c.parallel = parallel.default_parallel_config()
  c.metrics = train_metrics.default_config()
  c.profile = profiling.default_config()
  # The learner reads token t's log-prob at t - 1, a shift along the sequence: context
  # shards stay contiguous (c2jax.rl.learner.runtime).
  c.parallel.context_load_balance = False
  return c


def validate(cfg, num_devices: int | None = None) -> None:
  """Raises configlib.ConfigError naming the first bad key; `num_devices` adds the checks
  that need the mesh."""
  configlib.check_keys(cfg, job_defaults(cfg.model.name if "model" in cfg else "tiny"))
  model_config.validate(cfg.model)
  lineage.check_declared(cfg.model_changes)
  rl_config.validate(cfg.rl)
  agent_config.validate(cfg.agent)
  train_metrics.validate(cfg.metrics)
  profiling.validate(cfg.profile)
  agent_config.check_tokenizer(cfg.agent, cfg.data, cfg.model.vocab_size)
  for key in ("learner.steps", "learner.learning_rate", "learner.groups_per_step",
              "learner.microbatches",
              "learner.checkpoint_every", "learner.keep_checkpoints", "learner.log_every",
              "learner.clip_norm", "learner.wait_s", "actors.count", "actors.slots",
              "actors.max_length", "actors.weight_poll_s", "actors.full_every",
              "actors.check_every_s", "tasks.train_count", "tasks.heldout_count", "eval.every", "eval.samples",
              "eval.slots"):
    configlib.check_positive(cfg, key)
  for key in ("learner.warmup_steps", "actors.restarts", "eval.temperature"):
    configlib.check_positive(cfg, key, allow_zero=True)
  _check_speculation(cfg)
  from c2jax.rl.actors import backends as actors  # pylint: disable=g-import-not-at-top

  configlib.check_choice(cfg, "actors.backend", actors.ACTOR_BACKENDS)
  for key in ("learner.checkpoint_dir", "actors.weights_dir"):
    if configlib.get(cfg, key):
      try:
        storage.resolve(configlib.get(cfg, key), f"config.{key}")
      except storage.StorageLocationError as err:
        raise configlib.ConfigError(key, str(err)) from None
  engine_sharding.check_config(cfg.actors.parallel, cfg.actors.slots, "actors.parallel.")
  from c2jax_kernels import weight_quant  # pylint: disable=g-import-not-at-top
  configlib.check_choice(cfg, "actors.weights_quant", weight_quant.WEIGHT_QUANT_CHOICES)
  configlib.check_positive(cfg, "actors.hang_timeout_s")
  configlib.check_positive(cfg, "actors.processes")
  from c2jax.rl.tasks import task_sources  # pylint: disable=g-import-not-at-top

  configlib.check_choice(cfg, "tasks.source", task_sources.SOURCES)
  task_sources.validate(cfg.tasks, cfg.agent.backend)
  from c2jax.env import procgen  # pylint: disable=g-import-not-at-top

  bad = sorted(set(cfg.tasks.difficulties) - set(procgen.CATEGORIES))
  if cfg.tasks.source == "procgen" and (bad or not cfg.tasks.difficulties):
    raise configlib.ConfigError("tasks.difficulties", f"{list(cfg.tasks.difficulties)} must "
                                f"be a non-empty subset of {sorted(procgen.CATEGORIES)}.")
  if cfg.actors.max_length > cfg.model.max_position:
    raise configlib.ConfigError("actors.max_length", f"= {cfg.actors.max_length} exceeds "
                                f"model.max_position = {cfg.model.max_position}.")
  if cfg.agent.max_turn_tokens >= cfg.actors.max_length:
    raise configlib.ConfigError("agent.max_turn_tokens", "must be below actors.max_length "
                                "(the prompt needs room too).")
  agent = cfg.agent
  if (agent.context_management != "none"
      and agent.summary_trigger_tokens + agent.summary_tokens >= cfg.actors.max_length):
    raise configlib.ConfigError(
        "agent.summary_trigger_tokens", f"= {agent.summary_trigger_tokens} plus "
        f"agent.summary_tokens = {agent.summary_tokens} reaches actors.max_length = "
        f"{cfg.actors.max_length}: a segment at the trigger has no room left for its summary, "
        "so none would ever be written; lower the trigger or raise actors.max_length.")
  _check_sampling_is_scorable(cfg.agent)
  # Microbatches of whole rollouts' rows: padding rows alone would be wasted passes.
  accumulate.check_divisible(cfg.learner.groups_per_step * cfg.rl.group_size,
                             cfg.learner.microbatches, 1, "learner.microbatches",
                             "learner.groups_per_step * rl.group_size")
  _validate_parallel(cfg, num_devices)
  steps_needed = cfg.learner.steps * cfg.learner.groups_per_step
  if cfg.rl.curriculum.sampling == "running":
    if cfg.rl.curriculum.lookahead < cfg.actors.count:
      raise configlib.ConfigError(
          "rl.curriculum.lookahead", f"= {cfg.rl.curriculum.lookahead} draws cannot keep "
          f"actors.count = {cfg.actors.count} actors busy; raise it to at least that.")
  elif cfg.tasks.train_count < steps_needed:
    raise configlib.ConfigError(
        "tasks.train_count", f"= {cfg.tasks.train_count} prompts cannot feed "
        f"learner.steps * learner.groups_per_step = {steps_needed} groups: each prompt "
        "is trained once (single epoch); or draw prompts with replacement "
        "(rl.curriculum.sampling = 'running').")


def _check_speculation(cfg) -> None:
  draft = cfg.actors.num_draft_tokens
  if isinstance(draft, bool) or not isinstance(draft, int) or draft < 0:
    raise configlib.ConfigError("actors.num_draft_tokens",
                                f"is {draft!r}; must be a whole number >= 0 (0 = no "
                                "speculative decoding).")
  if draft and cfg.model.num_mtp_layers < 1:
    raise configlib.ConfigError(
        "actors.num_draft_tokens", f"= {draft} drafts with the policy's MTP modules, but "
        "model.num_mtp_layers = 0 (inherited from init_from). Start RL from a run that "
        "trained MTP modules (configs/mtp.py), or declare fresh ones with "
        "--config.model.num_mtp_layers=1 --config.model_changes=\"('num_mtp_layers',)\", or "
        "set actors.num_draft_tokens = 0.")
  if draft and draft + 1 >= cfg.actors.max_length:
    raise configlib.ConfigError("actors.num_draft_tokens", f"= {draft} leaves no room in "
                                f"actors.max_length = {cfg.actors.max_length}.")


def _check_sampling_is_scorable(agent_cfg) -> None:
  """The learner must score tokens under the distribution the actors sampled from
  (c2jax.rl.learner.step): temperature it reproduces; greedy and top-k / top-p truncation
  it cannot, so they are refused here instead of biasing every importance ratio."""
  if agent_cfg.temperature <= 0:
    raise configlib.ConfigError(
        "agent.temperature", "is 0 (greedy): RL needs sampled rollouts and a log-prob "
        "the learner can reproduce; use a temperature > 0 (1.0 is the model's own "
        "distribution).")
  if agent_cfg.top_k != 0:
    raise configlib.ConfigError(
        "agent.top_k", f"is {agent_cfg.top_k}: the learner cannot reproduce the sampler's "
        "top-k set from its own logits, so the importance ratio would be biased; set "
        "agent.top_k = 0 for RL (lower agent.temperature to sharpen sampling).")
  if agent_cfg.top_p != 1.0:
    raise configlib.ConfigError(
        "agent.top_p", f"is {agent_cfg.top_p}: the learner cannot reproduce the sampler's "
        "nucleus from its own logits, so the importance ratio would be biased; set "
        "agent.top_p = 1.0 for RL (lower agent.temperature to sharpen sampling).")


def _validate_parallel(cfg, num_devices: int | None) -> None:
  parallel.validate_parallel(cfg.parallel, num_devices)
  if num_devices is None:  # without devices, an axis of -1 counts as 1
    num_devices = math.prod(size for size in cfg.parallel.mesh.values() if size != -1)
  sizes = parallel.mesh.mesh_shape(cfg.parallel.mesh, num_devices)
  shards = context.num_shards(sizes, parallel.rules_of(cfg.parallel))
  if shards == 1:
    return
  if cfg.parallel.context_load_balance:
    raise configlib.ConfigError(
        "parallel.context_load_balance", "is True, but the learner reads each token's "
        "log-prob from the previous position, which needs the original token order; set "
        "it False (contiguous context shards) or use parallel.mesh.context = 1.")
  try:
    context.check_length(cfg.actors.max_length, shards, False)
  except ValueError as e:
    raise configlib.ConfigError("actors.max_length", str(e)) from None
