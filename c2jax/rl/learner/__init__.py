"""RL the learner: the jitted RL step, its runtime, losses, KL, advantages, packing.

Modules: advantages, kl, losses, mtp_distill, packing, runtime, step."""
