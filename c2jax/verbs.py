"""The verbs of the `c2jax` command: name -> (module, one-line description).

The one list of verbs: c2jax.cli dispatches on it (importing only the chosen verb's
module, by name) and sweeps check a sweep's verb against it, so it sits below both and
imports nothing.
"""

VERBS: dict[str, tuple[str, str]] = {
    "plan": ("c2jax.commands.plan",
             "parameter counts, shardings, compiled per-device memory and communication"),
    "pipeline": ("c2jax.commands.pipeline", "every stage end to end (pretrain, longctx, traces, sft, rl, eval)"),
    "pretrain": ("c2jax.commands.train", "continued pretraining / long-context phases"),
    "sft": ("c2jax.commands.train", "SFT phase on agent traces (chat data, loss mask)"),
    "smoke": ("c2jax.commands.smoke", "train a model config for a few steps on a synthetic task"),
    "data": ("c2jax.commands.data", "build the code corpus and tokenizer"),
    "convert": ("c2jax.commands.convert", "convert checkpoints between HF safetensors and c2jax"),
    "export": ("c2jax.commands.export", "write a run's parameters as an HF model directory"),
    "sandbox": ("c2jax.commands.sandbox", "run a command in a fresh sandbox over a repository"),
    "agent": ("c2jax.commands.agent", "run one model turn's tool calls in a sandbox"),
    "rl": ("c2jax.commands.rl", "asynchronous RL: learner + rollout actors in sandboxes"),
    "eval": ("c2jax.commands.eval", "score a checkpoint / endpoint on a suite; `eval report` tables + plot"),
    "serve": ("c2jax.commands.serve", "OpenAI-compatible server over a run or HF checkpoint"),
    "tasks": ("c2jax.commands.tasks", "auto-install a Python repository; build SWE-bench-format task suites from a Python, Go, Rust or node one"),
    "sweep": ("c2jax.commands.sweep", "run a grid of config overrides as runs; one table + plots"),
}
