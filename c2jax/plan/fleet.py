"""How many actor meshes keep an RL learner busy: the fleet line of `c2jax plan`.

    rollout = RolloutShape.of(cfg)                      # tokens of one rollout, at most
    estimate = fleet(rollout, learner_step_s=0.8, actor=ActorSpeed(...), max_lag=2)

The model, every input an upper bound or a compiler estimate (c2jax/plan/target.py):
  A rollout is budget-filling: it decodes `decode_tokens` (agent.max_turns x
  agent.max_turn_tokens, at most its length) and prefills the rest of its
  `total_tokens` (min(agent.max_total_tokens, actors.max_length): prompt and tool output).
  One actor mesh runs `slots` rollouts at once; a decode step emits one token for every
  slot in `decode_step_s` (the decode program's time per token at the full context, an
  upper bound for shorter ones); prefill runs in chunks of `prefill_tokens` tokens,
  `prefill_s` each, between decode steps, so it stalls every slot's decode.
  Mesh busy time per rollout: decode_tokens x decode_step_s / slots
                               + ceil(prefill tokens / chunk) x prefill_s.
  The learner takes rollouts_per_step rollouts per step of learner_step_s; it idles when
  the actors fall behind, so idle = max(0, 1 - supply / demand) and
  meshes = ceil((1 - idle_target) x demand / per-mesh supply).
  Lag: with every slot busy, one rollout takes decode_tokens x decode_step_s plus the
  prefills of all slots' rollouts; the learner steps rollout_s / learner_step_s times
  meanwhile. Above rl.queue.max_lag the group arrives too stale to train, and more
  meshes do not help (a rollout's own decode is the bound): raise max_lag, fewer slots
  or a faster mesh.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class RolloutShape:
  """Tokens of one budget-filling rollout (see the module docstring)."""
  total_tokens: int
  decode_tokens: int

  @property
  def prefill_tokens(self) -> int:
    return self.total_tokens - self.decode_tokens

  @classmethod
  def of(cls, cfg) -> RolloutShape:
    """From an RL job config: agent.* budgets within actors.max_length."""
    total = min(cfg.agent.max_total_tokens, cfg.actors.max_length)
    return cls(total, min(cfg.agent.max_turns * cfg.agent.max_turn_tokens, total))


@dataclasses.dataclass(frozen=True)
class ActorSpeed:
  """One actor mesh's engine: compiler estimates of its two programs."""
  slots: int
  chips: int
  decode_step_s: float    # one token for every slot
  prefill_tokens: int     # tokens per prefill chunk
  prefill_s: float        # one chunk

  @property
  def tokens_per_s_per_chip(self) -> float:
    """Decode tokens per second per chip with every slot busy."""
    return self.slots / self.decode_step_s / self.chips


@dataclasses.dataclass(frozen=True)
class FleetEstimate:
  meshes: int                  # actor meshes for the learner's idle time under the target
  chips: int                   # meshes x chips per mesh
  idle_target: float
  mesh_rollouts_per_s: float   # what one mesh supplies
  learner_rollouts_per_s: float  # what the learner consumes, never idle
  rollout_s: float             # one rollout's wall time on a full mesh
  staleness_steps: float       # learner steps during one rollout
  max_lag: int

  @property
  def lag_ok(self) -> bool:
    return self.staleness_steps <= self.max_lag

  def idle_fraction(self, meshes: int) -> float:
    """The learner's idle share with `meshes` actor meshes."""
    return max(0.0, 1.0 - meshes * self.mesh_rollouts_per_s / self.learner_rollouts_per_s)

  def line(self) -> str:
    took = _duration(self.rollout_s)
    lag = (f"a rollout takes {took} = {self.staleness_steps:.2f} learner "
           f"steps, within rl.queue.max_lag = {self.max_lag}" if self.lag_ok else
           f"but a rollout takes {took} = {self.staleness_steps:.2f} "
           f"learner steps, beyond rl.queue.max_lag = {self.max_lag}: its groups arrive "
           "too stale to train whatever the fleet; raise max_lag, use fewer slots or a "
           "faster actor mesh")
    return (f"fleet: {self.meshes} actor mesh(es) ({self.chips} chips) keep the learner's "
            f"idle time under {self.idle_target:.0%} (idle "
            f"{self.idle_fraction(self.meshes):.1%}; each mesh supplies "
            f"{self.mesh_rollouts_per_s:.3g} rollouts/s, the learner takes "
            f"{self.learner_rollouts_per_s:.3g}); {lag}")


def _duration(seconds: float) -> str:
  return f"{seconds * 1e3:,.3g} ms" if seconds < 1 else f"{seconds:,.1f} s"


def fleet(rollout: RolloutShape, *, learner_step_s: float, rollouts_per_step: int,
          actor: ActorSpeed, max_lag: int, idle_target: float = 0.1) -> FleetEstimate:
  """The fleet for one learner (see the module docstring)."""
  if learner_step_s <= 0 or actor.decode_step_s <= 0 or actor.prefill_s < 0:
    raise ValueError(f"fleet: times must be positive (learner step {learner_step_s} s, "
                     f"decode step {actor.decode_step_s} s, prefill {actor.prefill_s} s).")
  prefill_chunks = math.ceil(rollout.prefill_tokens / actor.prefill_tokens)
  prefill_s = prefill_chunks * actor.prefill_s
  mesh_s_per_rollout = rollout.decode_tokens * actor.decode_step_s / actor.slots + prefill_s
  supply = 1.0 / mesh_s_per_rollout
  demand = rollouts_per_step / learner_step_s
  meshes = max(1, math.ceil((1.0 - idle_target) * demand / supply - 1e-9))
  rollout_s = rollout.decode_tokens * actor.decode_step_s + actor.slots * prefill_s
  return FleetEstimate(meshes=meshes, chips=meshes * actor.chips, idle_target=idle_target,
                       mesh_rollouts_per_s=supply, learner_rollouts_per_s=demand,
                       rollout_s=rollout_s, staleness_steps=rollout_s / learner_step_s,
                       max_lag=max_lag)
