"""RL rollout actors: the actor process, process/Ray backends, rollouts, infra failures.

Modules: actor, backends, external_rollouts, infra, ray_link, rollouts."""
