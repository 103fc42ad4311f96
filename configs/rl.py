"""Asynchronous RL of a coding agent on procedural repositories, from an SFT checkpoint.

  c2jax pipeline --config=configs/agent_sft.py:tiny --workdir=runs/tiny_agent   # the start
  c2jax rl --config=configs/rl.py:tiny --workdir=runs/tiny_rl
Variants:
  tiny  the CPU demo: difficulty-0 tasks (the prompt names the constant to fix), two
        actors, held-out pass rate and best-of-4 at step 0 and every 10 steps
        (docs/benchmarks.md, "Reinforcement learning").
  summary  `tiny` with self-summarisation on (report §4.1): a segment reaching 256 tokens
        (the prompt is ~230) asks the policy for a summary of at most 64 tokens, up to
        twice a rollout, within the same 768-token budget; every segment of a chain is
        trained with the chain's reward. agent.context_management='compaction' gives the
        prompt-based baseline (docs/findings.md, experiments/findings/summary_vs_compaction.py).
  test  random init, a few prompts and steps: the test suite's check of the machinery.
  kimi_k25  the learner step at the report's RL scale, for planning: the Kimi-K2.5 model
        on the mesh fsdp=-1, expert=8, context=8 (EP=8, CP=8), 16 groups of 8 rollouts
        of up to 16k tokens a step.
        `c2jax plan --memory --config=configs/rl.py:kimi_k25 --mesh=fsdp=16,expert=8,context=8`
        (docs/scaling.md, "RL learner").
Override anything, e.g. --config.rl.kl.estimator=k3 --config.rl.advantage=grpo, or
--config.rl.curriculum.sampling=running to draw prompts by running pass-rate statistics
(c2jax/rl/tasks/curriculum.py; off by default, docs/benchmarks.md "Running curriculum").
"""

import pathlib

from c2jax import config as configlib
from c2jax.rl import job

TEST_ARGS = ("tiny", "summary", "test", "kimi_k25")
VARIANTS = TEST_ARGS
HERE = pathlib.Path(__file__).parent
# The tools the procedural tasks need; a short tool list keeps the prompt small for the
# CPU models (the SFT traces are rendered with the same list: configs/agent_sft.py).
AGENT_TOOLS = ("read_file", "edit_file", "finish")


def get_config(variant: str = "tiny"):
  variant = variant or "tiny"
  if variant not in VARIANTS:
    raise ValueError(f"configs/rl.py has variants {VARIANTS}, not {variant!r}.")
  if variant == "kimi_k25":
    return _kimi_k25()
  # The model is inherited from the checkpoint in init_from (YaRN and all, when the SFT
  # run came through the long-context phase); `tiny` only supplies the implementation
  # choices and the random-init model of the `test` variant.
  c = job.job_defaults("tiny")
  # The tokenizer of the SFT run the policy starts from: its data section.
  c.data = configlib.load_config_file(HERE / "pretrain.py", "tiny").data
  c.init_from = "runs/tiny_agent/sft"
  c.agent.tools = AGENT_TOOLS
  c.agent.max_turns = 4
  c.agent.max_turn_tokens = 96
  c.agent.max_total_tokens = 768
  c.tasks.difficulties = (0,)
  c.tasks.train_count = 400
  c.tasks.heldout_count = 32
  c.rl.group_size = 8
  c.learner.steps = 40
  c.learner.groups_per_step = 2
  # 3e-4 drifts away from the SFT policy and loses pass rate (docs/benchmarks.md).
  c.learner.learning_rate = 5e-5
  # Back-pressure: actors run at most a few groups ahead of the learner, so their groups
  # stay within max_lag policy versions instead of going stale.
  c.rl.queue.capacity = 4
  c.rl.queue.max_lag = 2
  c.actors.count = 2
  c.actors.slots = 8
  c.actors.max_length = 512
  c.eval.every = 10
  c.eval.samples = 4
  if variant == "summary":
    c.agent.context_management = "self_summary"
    c.agent.summary_trigger_tokens = 256
    c.agent.summary_tokens = 64
    c.agent.max_summaries = 2
    c.agent.max_turns = 6  # turns after a summary; the token budget is unchanged
  if variant == "test":
    c.init_from = ""
    c.agent.max_turns = 2
    c.agent.max_turn_tokens = 12
    c.agent.max_total_tokens = 64
    c.tasks.difficulties = (1,)
    c.tasks.train_count = 8
    c.tasks.heldout_count = 1
    c.rl.group_size = 2
    c.learner.steps = 3
    c.learner.groups_per_step = 1
    c.learner.checkpoint_every = 1
    c.rl.queue.capacity = 1
    c.rl.queue.max_lag = 3
    c.actors.count = 1
    c.actors.slots = 2
    c.actors.max_length = 640
    c.eval.every = 100
    c.eval.samples = 1
    c.eval.slots = 2
    c.eval.at_start = False
  return c


def _kimi_k25():
  """The RL learner at Kimi-K2.5 scale (plans; init_from names the SFT run to start from)."""
  c = job.job_defaults("kimi_k25")
  c.init_from = ""
  c.rl.group_size = 8
  c.learner.groups_per_step = 16
  c.learner.steps = 1000
  c.tasks.train_count = 16_000
  c.actors.max_length = 16_384
  c.agent.max_turn_tokens = 8_192
  # As in pretraining (configs/pretrain.py): grouped-matmul experts, capped MXFP8 dispatch,
  # blockwise attention.
  c.model.moe_impl = "pallas"
  c.model.moe.ep_capacity_factor = 1.25
  c.model.moe.ep_dispatch_quant = "mxfp8"
  c.model.attention_impl = "blockwise"
  c.parallel.mesh.expert = 8
  c.parallel.mesh.context = 8
  return c
