"""Held-out evaluation during RL: the learner's current weights on the held-out tasks,
through the eval harness (c2jax.eval), with the learner's own engine.

    heldout = HeldoutEval(cfg, run, writer, params, step)
    seconds = heldout(params, step)   # evals/step_N/, `c2jax eval report`-able

The same engine serves the curriculum probe (`heldout.engine_at(params, 0)`).
"""

from __future__ import annotations

import time

import jax

from c2jax.eval import engine_policy
from c2jax.eval import runner as eval_runner


def _host(params):
  """The learner's (possibly sharded) parameters as host arrays: the engine places them
  itself, and the learner's buffers are donated by its next step."""
  return jax.device_get(params)


class HeldoutEval:

  def __init__(self, cfg, run, writer, params, step: int):
    from c2jax.rollout import JaxEngine  # pylint: disable=g-import-not-at-top

    self.cfg, self.run, self.writer = cfg, run, writer
    self.engine = JaxEngine(cfg.model, _host(params), num_slots=cfg.eval.slots,
                            max_length=cfg.actors.max_length, version=step)
    agent = cfg.agent.copy_and_resolve_references()
    agent.temperature = cfg.eval.temperature
    self.policy = engine_policy.EnginePolicy(self.engine, run.tokenizer, agent, "rl")
    self.results: dict[int, dict] = {}

  def engine_at(self, params, step: int):
    self.engine.update_params(_host(params), step)
    return self.engine

  def __call__(self, params, step: int) -> float:
    """Evaluates `params` as of `step`; writes eval/* metrics; returns the seconds taken."""
    self.engine_at(params, step)
    started = time.monotonic()
    samples = self.cfg.eval.samples
    summary = eval_runner.evaluate_tasks(
        self.policy, self.run.heldout, self.run.dirs.root / "evals" / f"step_{step:06d}",
        samples=samples, ks=(1, samples), seed=self.cfg.learner.seed, suite_name="heldout",
        progress=False)["overall"]
    result = {"pass_rate": summary["accuracy"],
              f"best_of_{samples}": summary[f"best_of_{samples}"],
              f"pass@{samples}": summary[f"pass@{samples}"],
              "tokens_per_rollout": summary["completion_tokens"]["mean"],
              "turns": summary["turns"]["mean"],
              "infra_errors": summary["infra_errors"],
              "seconds": time.monotonic() - started}
    result = {k: float("nan") if v is None else float(v) for k, v in result.items()}
    self.results[step] = result
    self.writer.write(step, {f"eval/{k}": v for k, v in result.items()})
    print(f"rl: eval at step {step}: " + ", ".join(
        f"{k} {v:.3f}" for k, v in result.items()), flush=True)
    return result["seconds"]
