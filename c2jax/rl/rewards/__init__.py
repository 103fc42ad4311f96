"""RL rewards: the term registry, the length penalty, behaviour graders.

Modules: behaviour, length_penalty, model_grader, terms."""
