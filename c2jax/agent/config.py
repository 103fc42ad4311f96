"""Defaults and validation of the agent section of a config (`config.agent`).

The agent loop (loop.py) is shared by RL actors and evaluation, so both read this one
section: what the model is told (system prompt, tools), how it samples, and when a
rollout stops or summarises itself.
"""

from __future__ import annotations

import ml_collections

from c2jax import config as configlib
from c2jax.agent import conversation
from c2jax.agent.external import config as external_config
# toolset (the env toolset an agent section offers) lives with the episode that uses it;
# callers know it as agent.config.toolset too.
from c2jax.agent.episode import toolset  # pylint: disable=unused-import
from c2jax.data import model_tokenizer
from c2jax.env import sandbox
from c2jax.env import tools as tools_lib
from c2jax.toolcalls import formats

SYSTEM_PROMPT = ("You are a coding agent working in a repository at /workspace. Use the "
                 "tools to inspect and change the code, then call finish.")
SUMMARY_PROMPT = ("Your context is nearly full. Summarise your work so far for yourself: "
                  "what the task is, what you found, what you changed, and what is left. "
                  "Do not call tools.")
SUMMARY_HEADER = "Summary of your earlier work on this task:\n"
COMPACTION_PROMPT = ("You compact the context of a coding agent. Below are the agent's task "
                     "and its work so far. Write a short summary the agent can continue "
                     "from: the task, what it found, what it changed (files, edits), and "
                     "what is left. Do not call tools.")
# How a rollout outgrows its context (report §4.1), once a segment reaches
# summary_trigger_tokens:
#   none          no management: the rollout stops when the engine's context is full.
#   self_summary  the policy is asked, in its own sequence, to summarise its work; the
#                 summary is sampled and trained like any turn (it ends the segment) and
#                 the next segment starts from (system, task, summary).
#   compaction    prompt-based compaction, the baseline: a separate call of the model, on
#                 a fresh sequence holding compaction_prompt and the history as text,
#                 writes the summary; the next segment starts from it the same way, but
#                 the summary tokens are in no segment, so they are never trained.
CONTEXT_MANAGEMENT = ("none", "self_summary", "compaction")


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.system_prompt = SYSTEM_PROMPT
  c.tools = tuple(tools_lib.ToolsetConfig.tools)
  # How the model writes tool calls (c2jax.toolcalls.formats): 'c2jax' with c2jax's own
  # tokenizer; a released model's native format ('qwen3', 'kimi_k2') with its tokenizer
  # and chat template (data.tokenizer_dir).
  c.tool_format = "c2jax"
  c.strict_tools = True
  c.max_turns = 8
  c.max_turn_tokens = 256
  # Model + observation tokens over the whole chain, summaries included.
  c.max_total_tokens = 8192
  # One of CONTEXT_MANAGEMENT (above). With 'self_summary' or 'compaction', a segment
  # holding at least summary_trigger_tokens after a turn (or with no room for the next
  # one) is summarised, at most max_summaries times a chain, in up to summary_tokens.
  c.context_management = "none"
  c.summary_trigger_tokens = 0
  c.max_summaries = 2
  c.summary_tokens = 256
  c.summary_prompt = SUMMARY_PROMPT  # self_summary: the user message asking for it
  c.compaction_prompt = COMPACTION_PROMPT  # compaction: the compactor's system message
  c.summary_header = SUMMARY_HEADER  # starts the next segment's summary message
  c.temperature = 1.0
  c.top_k = 0
  c.top_p = 1.0
  # Time limit of one hidden-test run (grading after the rollout).
  c.grade_timeout_s = 60.0
  c.backend = "bubblewrap"
  # What one sandbox may write in all (MB; sandbox Limits.disk_mb): writes past it fail
  # inside with ENOSPC/EDQUOT, the host's disk keeps its space.
  c.sandbox_disk_mb = 1024
  # Tool execution and grading run in this many threads beside the decode loop.
  c.tool_threads = 4
  # An external agent harness (mini-swe-agent, a command) instead of this loop in RL.
  c.external = external_config.default_config()
  return c


def validate(cfg: ml_collections.ConfigDict, prefix: str = "agent") -> None:
  """Raises configlib.ConfigError naming the first bad key under `prefix`."""
  configlib.check_keys(cfg, default_config(), prefix + ".")
  wrapper = ml_collections.ConfigDict({prefix: cfg})
  key = lambda name: f"{prefix}.{name}"
  for name in ("max_turns", "max_turn_tokens", "max_total_tokens", "summary_tokens",
               "grade_timeout_s", "tool_threads", "sandbox_disk_mb"):
    configlib.check_positive(wrapper, key(name))
  for name in ("summary_trigger_tokens", "max_summaries", "temperature", "top_k"):
    configlib.check_positive(wrapper, key(name), allow_zero=True)
  if not 0.0 < cfg.top_p <= 1.0:
    raise configlib.ConfigError(key("top_p"), f"is {cfg.top_p}; use a value in (0, 1].")
  configlib.check_choice(wrapper, key("backend"), sandbox.backends())
  configlib.check_choice(wrapper, key("tool_format"), formats.format_names())
  unknown = sorted(set(cfg.tools) - set(tools_lib.tool_names()))
  if unknown:
    raise configlib.ConfigError(key("tools"), f"names unknown tools {unknown}; registered "
                                f"tools are {tools_lib.tool_names()}.")
  if "finish" not in cfg.tools:
    raise configlib.ConfigError(key("tools"), "must include 'finish': it is how the agent "
                                "ends a task.")
  if "external" in cfg:
    external_config.validate(cfg.external, key("external"))
  configlib.check_choice(wrapper, key("context_management"), CONTEXT_MANAGEMENT)
  if cfg.context_management == "none" and cfg.summary_trigger_tokens:
    raise configlib.ConfigError(
        key("summary_trigger_tokens"), f"= {cfg.summary_trigger_tokens} but "
        f"{key('context_management')} = 'none', so nothing would be summarised; set "
        f"{key('context_management')} to 'self_summary' or 'compaction', or the trigger "
        "to 0.")
  if cfg.context_management != "none" and not cfg.summary_trigger_tokens:
    raise configlib.ConfigError(
        key("summary_trigger_tokens"), f"is 0 but {key('context_management')} = "
        f"{cfg.context_management!r} needs a trigger: the segment length (tokens) at which "
        "to summarise.")
  if cfg.context_management != "none" and "external" in cfg and cfg.external.enabled:
    raise configlib.ConfigError(
        key("context_management"), f"is {cfg.context_management!r} but "
        f"{key('external.enabled')} is True: an external harness manages its own context "
        "(c2jax's loop does not run); set context_management='none'.")
  if 0 < cfg.summary_trigger_tokens <= cfg.max_turn_tokens:
    raise configlib.ConfigError(
        key("summary_trigger_tokens"), f"= {cfg.summary_trigger_tokens} must exceed "
        f"agent.max_turn_tokens = {cfg.max_turn_tokens} (a segment needs room for a turn).")


def check_tokenizer(cfg: ml_collections.ConfigDict, data_cfg: ml_collections.ConfigDict,
                    model_vocab_size: int) -> None:
  """agent.tool_format against the tokenizer the data section names: c2jax's protocol with
  c2jax's tokenizer; with a released model's (data.tokenizer_dir) a format that reads the
  tool calls its chat template writes, and a vocabulary the model's embedding covers."""
  if data_cfg.tokenizer_dir is None:
    if cfg.tool_format != "c2jax":
      raise configlib.ConfigError("agent.tool_format", f"is {cfg.tool_format!r} but "
                                  "data.tokenizer_dir is unset, so the model speaks c2jax's "
                                  "template and protocol; set agent.tool_format='c2jax' or "
                                  "data.tokenizer_dir to the released model's directory.")
    return
  try:
    tokenizer = model_tokenizer.load_model_tokenizer(data_cfg.tokenizer_dir)
    conversation.check_tool_format(tokenizer, cfg.tool_format)
  except (OSError, ValueError) as e:
    raise configlib.ConfigError("agent.tool_format", str(e)) from e
  if tokenizer.vocab_size > model_vocab_size:
    raise configlib.ConfigError("data.tokenizer_dir", f"holds a tokenizer of "
                                f"{tokenizer.vocab_size} tokens but model.vocab_size is "
                                f"{model_vocab_size}; use the model the tokenizer belongs to.")
