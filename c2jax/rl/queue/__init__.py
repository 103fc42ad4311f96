"""RL finished groups: assembly, the staleness-aware queue and its on-disk store.

Modules: group_queue, group_store, groups."""
