"""RL rollout actors: the actor process, process/Ray backends, rollouts, infra failures.

Modules: actor, actor_set, backends, external_rollouts, infra, ray_actors, ray_link, rollouts."""
