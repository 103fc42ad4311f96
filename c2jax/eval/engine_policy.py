"""The in-process policy: a c2jax checkpoint on the JaxEngine, through the agent loop.

Episodes run with `agent.loop.run_episodes`, the same loop RL rollouts use (continuous
batching: every live episode decodes in one engine step while tools and grading run in
threads). The RL trainer's held-out evaluation builds an EnginePolicy around its own
engine; `c2jax eval` builds one from a run directory (`EnginePolicy.from_run`).
"""

from __future__ import annotations

import json
import pathlib

from c2jax.agent import loop as agent_loop
from c2jax.eval import episode as episode_lib


def load_hf(directory: pathlib.Path):
  """(model config, params, tokenizer) of an HF directory (config.json, safetensors,
  tokenizer.json), released FP8 / INT4 layouts dequantised by c2jax.hf."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from c2jax.data.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  from c2jax.hf import convert  # pylint: disable=g-import-not-at-top

  tokenizer_path = directory / "tokenizer.json"
  if not tokenizer_path.is_file():
    raise FileNotFoundError(f"config.policy.run = {str(directory)!r} is an HF directory "
                            "without tokenizer.json; copy the model's tokenizer.json there.")
  model_cfg, params = convert.load(directory)
  tokenizer = Tokenizer.load(tokenizer_path)
  if tokenizer.vocab_size > model_cfg.vocab_size:
    raise ValueError(f"{tokenizer_path} has {tokenizer.vocab_size} tokens (special tokens "
                     f"included) but the model's vocab_size is {model_cfg.vocab_size}; "
                     "ids past the embedding would be silently clamped.")
  return model_cfg, {k: _to_jax(v, jnp) for k, v in params.items()}, tokenizer


def _to_jax(tree, jnp):
  import jax  # pylint: disable=g-import-not-at-top

  return jax.tree.map(jnp.asarray, tree)


def load_run(run_dir: str):
  """(model config, params, tokenizer) of the newest checkpoint of a c2jax run dir (a
  local path or any URL c2jax.storage reads), or of a local HF directory (see load_hf)."""
  import jax  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top

  from c2jax import data, model  # pylint: disable=g-import-not-at-top
  from c2jax.config import apply_overrides  # pylint: disable=g-import-not-at-top
  from c2jax.model import variants  # pylint: disable=g-import-not-at-top
  from c2jax.train import init_params  # pylint: disable=g-import-not-at-top

  from c2jax import storage  # pylint: disable=g-import-not-at-top

  directory = storage.orbax_path(run_dir, "config.policy.run")
  config_path = directory / "config.json"
  if not config_path.is_file():
    raise FileNotFoundError(
        f"config.policy.run = {run_dir!r} has no config.json; point it at a training stage "
        "folder written by c2jax pretrain/sft/rl (e.g. runs/tiny_agent/sft) or an HF "
        "model directory.")
  saved = json.loads(config_path.read_text())
  if "model" not in saved:  # HF's config.json describes the model at its top level
    return load_hf(storage.require_local(run_dir, "config.policy.run", "an HF model "
                                         "directory"))
  model_cfg = variants.get(saved["model"]["name"])
  apply_overrides(model_cfg, saved["model"])
  tokenizer = data.prepare_from_config(ml_collections.ConfigDict(saved["data"]),
                                       progress=False).tokenizer()
  fresh = model.init(model_cfg, jax.random.key(0))
  params = init_params.restore_init_params(
      ml_collections.ConfigDict({"init_from": str(directory), "model": model_cfg}), fresh)
  return model_cfg, params, tokenizer


def outcome_of(trajectory: agent_loop.Trajectory) -> episode_lib.Outcome:
  sampled = sum(int(s.loss_mask.sum()) for s in trajectory.segments)
  total = sum(len(s.tokens) for s in trajectory.segments)
  return episode_lib.Outcome(
      passed=dict(trajectory.passed), finish_reason=trajectory.finish_reason,
      messages=trajectory.messages, turns=int(trajectory.stats.turns),
      tool_calls=int(sum(trajectory.stats.tool_call_counts.values())),
      wall_s=float(trajectory.duration_s), completion_tokens=sampled,
      prompt_tokens=total - sampled,
      extra={"segments": len(trajectory.segments),
             "policy_version": trajectory.policy_version})


class EnginePolicy:
  """Runs jobs through the agent loop on `engine` (a rollout.Engine)."""

  def __init__(self, engine, tokenizer, agent_cfg, label: str = "engine",
               sandbox_factory=None):
    """engine: a rollout.Engine, or a function making one on first use (a suite that
    only scores logits, such as codebase_ppl, never allocates the engine's KV cache)."""
    self._engine = engine
    self.tokenizer, self.agent_cfg = tokenizer, agent_cfg
    self.sandbox_factory = sandbox_factory
    self.label = label

  @property
  def engine(self):
    if callable(self._engine) and not hasattr(self._engine, "generate"):
      self._engine = self._engine()
    return self._engine

  @classmethod
  def from_run(cls, run_dir: str, agent_cfg, *, slots: int, max_length: int,
               label: str = ""):
    from c2jax.rollout import JaxEngine  # pylint: disable=g-import-not-at-top

    model_cfg, params, tokenizer = load_run(run_dir)
    if max_length > model_cfg.max_position:
      raise ValueError(f"config.policy.max_length = {max_length} exceeds the model's "
                       f"max_position = {model_cfg.max_position}.")
    engine = lambda: JaxEngine(model_cfg, params, num_slots=slots, max_length=max_length,
                               detokenize=tokenizer.decode)
    policy = cls(engine, tokenizer, agent_cfg, label or str(run_dir).rstrip("/").split("/")[-1])
    policy.model_cfg, policy.params = model_cfg, params  # for scored (base-model) suites
    return policy

  def run(self, jobs, on_done) -> None:
    def report(index, result):
      if isinstance(result, agent_loop.PromptTooLongError):
        # The policy cannot read the task: its failure, not the infrastructure's.
        on_done(jobs[index], episode_lib.Outcome(
            passed={}, finish_reason="context", messages=[], turns=0, tool_calls=0,
            wall_s=0.0, completion_tokens=0, prompt_tokens=0, extra={"note": str(result)}))
      elif isinstance(result, agent_loop.RolloutError):
        on_done(jobs[index], episode_lib.InfraError(str(result)))
      else:
        on_done(jobs[index], outcome_of(result))

    agent_loop.run_episodes(self.engine, self.tokenizer, self.agent_cfg,
                            [job.task for job in jobs], seeds=[job.seed for job in jobs],
                            sandbox_factory=self.sandbox_factory, on_result=report)

  def close(self) -> None:
    pass
