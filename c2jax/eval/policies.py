"""The policy registry: what `config.policy.kind` can name, and how each is built.

  oracle    the scripted solver (c2jax/eval/oracle.py): checks the harness itself
  engine    a c2jax run directory on the in-process JaxEngine (engine_policy.py)
  openai    any OpenAI-compatible endpoint through the official client (openai_policy.py)

A policy has `label` and `run(jobs, on_done)`, calling `on_done(job, Outcome |
InfraError)` once per job as episodes end (from any thread), and `close()`.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_collections

from c2jax import config as configlib


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "oracle"
  c.label = ""  # name in reports; '' = the run dir's name / the model / 'oracle'
  # A transient infrastructure failure of an episode is retried this many times, then
  # recorded as infra_error (excluded from accuracy, reported apart).
  c.retries = 2
  c.retry_backoff_s = 1.0
  # Episodes in flight at once (oracle, openai); the engine uses `slots`.
  c.concurrency = 4
  # engine: a c2jax training stage folder (config.json + checkpoints/).
  c.run = ""
  c.slots = 8
  c.max_length = 1024
  # openai: endpoint, model, the NAME of the env var holding the key ('' = no key).
  c.base_url = ""
  c.model = ""
  c.api_key_env = "OPENAI_API_KEY"
  c.tool_calls = "native"
  c.timeout_s = 120.0
  c.price_prompt_per_mtok = 0.0
  c.price_completion_per_mtok = 0.0
  return c


def _validate_engine(cfg) -> None:
  if not cfg.policy.run:
    raise configlib.ConfigError("policy.run", "is empty; set it to a c2jax run directory "
                                "(e.g. --config.policy.run=runs/tiny_agent/sft).")
  for key in ("policy.slots", "policy.max_length"):
    configlib.check_positive(cfg, key)
  if cfg.agent.max_turn_tokens >= cfg.policy.max_length:
    raise configlib.ConfigError("agent.max_turn_tokens", f"= {cfg.agent.max_turn_tokens} "
                                f"must be below policy.max_length = {cfg.policy.max_length}.")


def _validate_openai(cfg) -> None:
  from c2jax.eval import openai_policy  # pylint: disable=g-import-not-at-top

  for key in ("base_url", "model"):
    if not cfg.policy[key]:
      raise configlib.ConfigError(f"policy.{key}", "is empty; an openai policy needs "
                                  "policy.base_url (e.g. http://127.0.0.1:8000/v1) and "
                                  "policy.model.")
  configlib.check_choice(cfg, "policy.tool_calls", openai_policy.TOOL_CALL_MODES)
  configlib.check_positive(cfg, "policy.timeout_s")
  for key in ("policy.price_prompt_per_mtok", "policy.price_completion_per_mtok"):
    configlib.check_positive(cfg, key, allow_zero=True)


def _build_oracle(cfg):
  from c2jax.eval import oracle  # pylint: disable=g-import-not-at-top

  return oracle.OraclePolicy(cfg.agent.backend, cfg.policy.concurrency,
                             cfg.agent.grade_timeout_s, cfg.agent.sandbox_disk_mb)


def _build_engine(cfg):
  from c2jax.eval import engine_policy  # pylint: disable=g-import-not-at-top

  return engine_policy.EnginePolicy.from_run(cfg.policy.run, cfg.agent,
                                             slots=cfg.policy.slots,
                                             max_length=cfg.policy.max_length,
                                             label=cfg.policy.label)


def _build_openai(cfg):
  from c2jax.eval import openai_policy  # pylint: disable=g-import-not-at-top

  return openai_policy.OpenAIPolicy(cfg.policy, cfg.agent)


# kind -> (validate(cfg), build(cfg))
POLICIES: dict[str, tuple[Callable, Callable]] = {
    "oracle": (lambda cfg: None, _build_oracle),
    "engine": (_validate_engine, _build_engine),
    "openai": (_validate_openai, _build_openai),
}


def validate(cfg) -> None:
  configlib.check_choice(cfg, "policy.kind", POLICIES)
  for key in ("policy.retries", "policy.retry_backoff_s"):
    configlib.check_positive(cfg, key, allow_zero=True)
  configlib.check_positive(cfg, "policy.concurrency")
  POLICIES[cfg.policy.kind][0](cfg)


def build(cfg):
  return POLICIES[cfg.policy.kind][1](cfg)
