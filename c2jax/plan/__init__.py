"""`c2jax plan`: what a config costs before it runs.

Planning sits above the runtimes it plans (train, the RL learner, the rollout engine) and
below the command line; nothing in the runtimes imports it.

Modules: shardings (every parameter's logical axes, mesh axes and per-device shard),
memory (ahead-of-time compile of the real jitted steps on a simulated mesh: per-device
memory), hlo_comms (communication volume from compiled HLO), roofline (model and XLA
FLOPs and bytes against accelerator peaks), accelerators (the chips' datasheet table and
this machine's measured ceiling), measure (real step times on this machine).
"""
