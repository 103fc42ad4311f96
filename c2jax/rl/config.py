"""Defaults and validation of the RL section of a config (`config.rl`).

configs/rl.py builds on `default_config()`; `validate` checks every name against the
registries it selects from (a new reward term also needs its default entry here, since
the defaults are the schema of known keys).
The report publishes no values for the length penalty or behaviour terms; the defaults
below are chosen so a typical rollout (a few thousand tokens, ~10 tool calls) loses a
few hundredths of reward to length, well below one solved task.
"""

from __future__ import annotations

import ml_collections

from c2jax import config as configlib
from c2jax.rl.learner import advantages
from c2jax.rl.tasks import curriculum
from c2jax.rl.learner import kl
from c2jax.rl.learner import losses


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.group_size = 8
  c.advantage = "dr_grpo"
  c.std_eps = 1e-6  # only `grpo` divides by the std

  c.loss = ml_collections.ConfigDict(dict(
      policy_loss="tis",
      tis_cap=2.0,
      clip_low=0.2,
      clip_high=0.28,
      aggregation="constant",
      normalizer_tokens=4096.0,  # Dr. GRPO's constant: about the generation budget
  ))
  # Drop the policy gradient of tokens (mode 'token') or rows ('sequence', by the row's
  # geometric-mean ratio) whose learner / sampler ratio is outside [low, high]: IcePop /
  # masked importance sampling (c2jax.rl.learner.losses). 'off': tis_cap alone.
  c.mismatch_mask = ml_collections.ConfigDict(dict(mode="off", low=0.5, high=2.0))
  # The learner's log-probs are computed in chunks of seq_chunk positions x vocab_chunk
  # columns (largest live float32 array: rows x seq_chunk x vocab_chunk).
  c.logprobs = ml_collections.ConfigDict(dict(seq_chunk=512, vocab_chunk=8192))
  c.kl = ml_collections.ConfigDict(dict(estimator="k1", placement="reward", coef=1e-3))

  c.reward = ml_collections.ConfigDict(dict(
      correctness=dict(scale=1.0, partial_credit=False),
      length_penalty=dict(
          scale=1e-5, k=1e-3, q=0.5,
          weights=dict(thinking_tokens=1.0, tool_call_tokens=1.0, tool_output_tokens=0.25,
                       final_message_tokens=1.0, tool_calls=20.0, turns=20.0)),
      tool_call_errors=dict(scale=0.02),
      unfinished_todos=dict(scale=0.05),
      shell_only=dict(scale=0.1, shell_tool="run_shell", ignore_tools=("finish", "todo")),
      # Behaviour graders (c2jax/rl/rewards/behaviour.py): off until scale > 0; a grader with
      # weight 0 does not run. The model judge needs an endpoint (model_grader.py).
      behaviour=dict(scale=0.0, graders=dict(
          cot_comments=dict(weight=1.0, shell_tool="run_shell", max_comment_lines=6),
          shell_collapse=dict(weight=1.0, shell_tool="run_shell",
                              dedicated_tools=("read_file", "grep", "list_dir", "glob",
                                               "edit_file", "write_file")),
          final_message=dict(weight=1.0, min_chars=20, max_chars=2000, max_code_lines=20),
          model=dict(weight=0.0, base_url="", model="", api_key_env="OPENAI_API_KEY",
                     rubric="", max_transcript_chars=12000, timeout_s=60.0),
      )),
  ))

  # Infrastructure failures (sandbox crash, engine error) are never rewards: a rollout
  # is rerun on a fresh sandbox up to `retries` times; if it still fails its group is
  # dropped and the prompt goes back to the pool, at most `prompt_returns` times (then
  # the prompt is dropped for good). Counted as metrics infra_failures / infra_retries.
  c.infra = ml_collections.ConfigDict(dict(retries=2, prompt_returns=2))
  c.router_replay = ml_collections.ConfigDict(dict(filter=True, factor=0.5))
  c.queue = ml_collections.ConfigDict(dict(capacity=16, max_lag=2, poll_s=0.02))
  c.packing = ml_collections.ConfigDict(dict(attention_cost=1.0 / 4096))
  # The curriculum (c2jax/rl/tasks/curriculum.py). sampling = 'order': every prompt once
  # (single epoch); with strength > 0 the starting policy first rolls out every prompt
  # `probe_samples` times and prompts that needed more turns / thinking tokens are leased
  # earlier (strength 0 = the pool's own order). sampling = 'running': prompts are drawn
  # with replacement while the learner trains, weighted by moving averages (weight `ema`
  # on the newest group) of each prompt's pass rate (groups likely to be all-pass or
  # all-fail, which have zero advantage, are down-weighted to `min_weight`; unseen
  # prompts count as `prior_pass`) times (turns/thinking difficulty) ** strength; the
  # learner keeps `lookahead` draws pending or leased. probe_samples > 0 seeds those
  # averages from probe rollouts of every prompt (0 = start from the prior).
  c.curriculum = ml_collections.ConfigDict(dict(
      sampling="order", strength=0.0, turns_weight=1.0, thinking_weight=1.0,
      probe_samples=1, ema=0.3, prior_pass=0.5, min_weight=0.05, lookahead=4))
  # Online self-distillation of the policy's MTP heads (when model.num_mtp_layers > 0):
  # each learner step adds mtp_loss_weight x (KL of every MTP depth to the main head at
  # the position predicting the same generated token), detached from the trunk, so the
  # drafter follows the policy (c2jax.rl.learner.mtp_distill). 0 leaves the heads as they are.
  c.mtp_loss_weight = 1.0
  # That loss runs in chunks of mtp_seq_chunk positions per MTP depth (largest live
  # float32 array: rows x mtp_seq_chunk x vocab).
  c.mtp_seq_chunk = 256
  # The heads' learning rate relative to learner.learning_rate (Adam is scale-free in the
  # loss weight, so this, not the weight, sets how fast the heads move).
  c.mtp_lr_scale = 1.0
  return c


def validate(cfg: ml_collections.ConfigDict, prefix: str = "rl") -> None:
  """Raises configlib.ConfigError naming the first bad key under `prefix`."""
  configlib.check_keys(cfg, default_config(), prefix + ".")
  key = lambda name: f"{prefix}.{name}"
  wrapper = ml_collections.ConfigDict({prefix: cfg})
  configlib.check_choice(wrapper, key("advantage"), advantages.ADVANTAGE_ESTIMATORS)
  configlib.check_choice(wrapper, key("loss.policy_loss"), losses.POLICY_LOSSES)
  configlib.check_choice(wrapper, key("loss.aggregation"), losses.AGGREGATIONS)
  configlib.check_choice(wrapper, key("kl.estimator"), kl.KL_ESTIMATORS)
  configlib.check_choice(wrapper, key("kl.placement"), kl.KL_PLACEMENTS)
  configlib.check_choice(wrapper, key("curriculum.sampling"), curriculum.SAMPLINGS)
  configlib.check_choice(wrapper, key("mismatch_mask.mode"), losses.MISMATCH_MASKS)
  band = cfg.mismatch_mask
  if not 0.0 <= band.low <= 1.0 <= band.high:
    raise configlib.ConfigError(key("mismatch_mask.low"), f"= {band.low} and high = "
                                f"{band.high}: the band must hold ratio 1 (0 <= low <= 1 "
                                "<= high), e.g. low=0.5, high=2.0.")
  for name in ("group_size", "loss.tis_cap", "loss.normalizer_tokens", "queue.capacity",
               "reward.length_penalty.k", "logprobs.seq_chunk", "logprobs.vocab_chunk",
               "mtp_seq_chunk", "curriculum.ema", "curriculum.min_weight", "curriculum.lookahead"):
    configlib.check_positive(wrapper, key(name))
  for name in ("std_eps", "kl.coef", "loss.clip_low", "loss.clip_high", "queue.max_lag",
               "reward.length_penalty.q", "packing.attention_cost", "curriculum.strength",
               "curriculum.turns_weight", "curriculum.thinking_weight",
               "curriculum.probe_samples", "curriculum.prior_pass", "infra.retries",
               "infra.prompt_returns", "mtp_loss_weight", "mtp_lr_scale"):
    configlib.check_positive(wrapper, key(name), allow_zero=True)
  for name in ("infra.retries", "infra.prompt_returns", "curriculum.probe_samples",
               "curriculum.lookahead"):
    if not isinstance(configlib.get(wrapper, key(name)), int):
      raise configlib.ConfigError(key(name), "must be a whole number.")
  _validate_curriculum(cfg.curriculum, key("curriculum"))
  if cfg.advantage == "rloo" and cfg.group_size < 2:
    raise configlib.ConfigError(key("group_size"), "must be >= 2 for advantage 'rloo'.")
  if not 0.0 < cfg.router_replay.factor <= 1.0:
    raise configlib.ConfigError(key("router_replay.factor"),
                                f"is {cfg.router_replay.factor}; must be in (0, 1].")
  if "behaviour" in cfg.reward:
    _validate_behaviour(wrapper, cfg.reward.behaviour, key("reward.behaviour"))


def _validate_curriculum(curriculum_cfg, prefix: str) -> None:
  for name in ("ema", "prior_pass", "min_weight"):
    if curriculum_cfg[name] > 1:
      raise configlib.ConfigError(f"{prefix}.{name}", f"is {curriculum_cfg[name]}; must be "
                                  "at most 1 (it is a weight or a pass rate).")
  if curriculum_cfg.turns_weight + curriculum_cfg.thinking_weight <= 0:
    raise configlib.ConfigError(f"{prefix}.turns_weight", "and thinking_weight are both 0; "
                                "difficulty needs at least one of them.")
  if (curriculum_cfg.sampling == "order" and curriculum_cfg.strength > 0
      and curriculum_cfg.probe_samples == 0):
    raise configlib.ConfigError(f"{prefix}.probe_samples", "is 0 but strength > 0: the "
                                "'order' curriculum ranks prompts by probe rollouts; set "
                                "probe_samples >= 1 or strength = 0.")


def _validate_behaviour(wrapper, behaviour_cfg, prefix: str) -> None:
  from c2jax.rl.rewards import behaviour  # pylint: disable=import-outside-toplevel

  configlib.check_positive(wrapper, prefix + ".scale", allow_zero=True)
  for name in behaviour_cfg.graders.keys():
    if name not in behaviour.grader_names():
      raise configlib.ConfigError(f"{prefix}.graders.{name}", "is not a behaviour grader; "
                                  f"known graders: {behaviour.grader_names()}.")
    configlib.check_positive(wrapper, f"{prefix}.graders.{name}.weight", allow_zero=True)
  judge = behaviour_cfg.graders.get("model")
  if behaviour_cfg.scale > 0 and judge is not None and judge.weight > 0:
    for field in ("base_url", "model"):
      if not judge[field]:
        raise configlib.ConfigError(f"{prefix}.graders.model.{field}", "is empty; the "
                                    "model grader needs an OpenAI-compatible endpoint "
                                    "(base_url ending in /v1) and a model id.")
