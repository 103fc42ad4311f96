"""The in-process policy: a c2jax checkpoint on the JaxEngine, through the agent loop.

Episodes run with `agent.loop.run_episodes`, the same loop RL rollouts use (continuous
batching: every live episode decodes in one engine step while tools and grading run in
threads). The RL trainer's held-out evaluation builds an EnginePolicy around its own
engine; `c2jax eval` builds one from a run directory (`EnginePolicy.from_run`).
"""

from __future__ import annotations


from c2jax.agent import loop as agent_loop
from c2jax.eval import episode as episode_lib
from c2jax.train import run_loading


def load_run(run_dir: str):
  """(model config, params, tokenizer) of the newest checkpoint of a c2jax run dir (a
  local path or any URL c2jax.storage reads), or of a local HF directory, MTP drafter kept
  (c2jax.train.run_loading)."""
  run = run_loading.load_run(run_dir, keep_mtp=True, flag="config.policy.run")
  return run.cfg, run.params, run.tokenizer


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

  def run(self, jobs, on_done, should_start=None) -> None:
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
                            sandbox_factory=self.sandbox_factory, on_result=report,
                            should_start=should_start)

  def close(self) -> None:
    pass
