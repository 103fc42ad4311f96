"""RL where prompts come from: task sources, the task pool, the curriculum.

Modules: curriculum, curriculum_pool, task_pool, task_sources."""
