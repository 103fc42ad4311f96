"""One episode of the agent loop: its records (Segment, Trajectory) and its state.

An Episode holds what one task's rollout has done so far: the conversation, the segment
being built (tokens, loss mask, sampler log-probs, policy versions, expert indices per
token), the closed segments, and counts. loop.run_episodes drives many of them at once;
the Episode itself never touches the engine.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from c2jax.agent import conversation as conversation_lib
from c2jax.agent import prompt as prompt_lib
from c2jax.agent.stats import TrajectoryStats
from c2jax.env import reward as reward_lib
from c2jax.env import sandbox as sandbox_lib
from c2jax.env import tasks as tasks_lib
from c2jax.env import tools as tools_lib
from c2jax.rollout.types import SamplingParams
from c2jax.toolcalls import protocol

# finish: the model called finish; answer: a turn without tool calls (a final message);
# max_turns / budget (max_total_tokens) / context (the engine's max_length): cut off.
FINISH_REASONS = ("finish", "answer", "max_turns", "budget", "context")


def toolset(cfg) -> tools_lib.ToolsetConfig:
  """The environment's toolset for an agent section (config.agent)."""
  return tools_lib.ToolsetConfig(tools=tuple(cfg.tools), strict=cfg.strict_tools)


@dataclasses.dataclass
class Segment:
  """One engine sequence of a chain. T tokens, Lm MoE layers, K experts per token."""
  tokens: np.ndarray  # [T] int32
  loss_mask: np.ndarray  # [T] int32: 1 on sampled tokens
  sampler_logprobs: np.ndarray  # [T] float32: log mu(token t); 0 where loss_mask is 0
  versions: np.ndarray  # [T] int32: policy version that sampled token t; -1 if not sampled
  router_indices: np.ndarray  # [T, Lm, K] int32: experts used when token t was fed
  stats: TrajectoryStats  # this segment's counts (tests are graded per chain)

  def arrays(self) -> dict[str, np.ndarray]:
    return {"tokens": self.tokens, "loss_mask": self.loss_mask,
            "sampler_logprobs": self.sampler_logprobs, "versions": self.versions,
            "router_indices": self.router_indices}


@dataclasses.dataclass
class Trajectory:
  """A finished chain: its segments, whole-chain stats (tests included), how it ended."""
  task_id: str
  segments: list[Segment]
  stats: TrajectoryStats
  finish_reason: str
  messages: list[dict]  # OpenAI-style transcript, for reading; training uses the tokens
  passed: dict[str, bool]  # hidden test id -> passed
  duration_s: float
  infra_retries: int = 0  # fresh-sandbox restarts after infrastructure failures
  # Tokens counted against agent.max_total_tokens: sampled (summaries included) and fed
  # after the first prompt (0 from producers that do not count them: external harnesses).
  total_tokens: int = 0
  # Prompt tokens of compaction calls (agent.context_management='compaction'): the
  # extra prefill of re-reading the history, in no segment and not in total_tokens (their
  # sampled summaries are).
  compaction_tokens: int = 0

  @property
  def solved(self) -> bool:
    return bool(self.passed) and all(self.passed.values())

  @property
  def policy_version(self) -> int:
    """The oldest policy version that sampled any token (-1 when none was sampled)."""
    sampled = [s.versions[s.loss_mask > 0] for s in self.segments]
    sampled = np.concatenate(sampled) if sampled else np.zeros(0, np.int32)
    return int(sampled.min()) if sampled.size else -1


class SegmentBuilder:
  """Accumulates one engine sequence's tokens and per-token records."""

  def __init__(self):
    self.tokens, self.mask, self.logprobs, self.versions, self.routing = [], [], [], [], []
    self.counts = dict(thinking_tokens=0, tool_call_tokens=0, tool_output_tokens=0,
                       final_message_tokens=0, turns=0, tool_call_errors=0,
                       unfinished_todos=0)
    self.tool_call_counts: dict[str, int] = {}

  def __len__(self) -> int:
    return sum(len(t) for t in self.tokens)

  def add(self, generation) -> None:
    fed, sampled = len(generation.prompt_tokens), len(generation.tokens)
    self.tokens += [generation.prompt_tokens, generation.tokens]
    self.mask += [np.zeros(fed, np.int32), np.ones(sampled, np.int32)]
    self.logprobs += [np.zeros(fed, np.float32), generation.logprobs.astype(np.float32)]
    self.versions += [np.full(fed, -1, np.int32), generation.versions.astype(np.int32)]
    self.routing.append(generation.expert_indices.astype(np.int32))

  def build(self) -> Segment:
    stats = TrajectoryStats(tool_call_counts=dict(self.tool_call_counts), **self.counts)
    cat = lambda parts, dtype: np.concatenate(parts).astype(dtype)
    return Segment(cat(self.tokens, np.int32), cat(self.mask, np.int32),
                   cat(self.logprobs, np.float32), cat(self.versions, np.int32),
                   cat(self.routing, np.int32), stats)


class Episode:
  """One task's rollout as a state machine driven by loop.run_episodes (main thread only,
  except the `*_work` methods, which run in a worker thread)."""

  def __init__(self, cfg, tokenizer, task: tasks_lib.Task, seed: int | None,
               sandbox_factory: Callable[[tasks_lib.Task], sandbox_lib.Sandbox],
               attempt: int = 0):
    self.cfg, self.tokenizer, self.task, self.seed = cfg, tokenizer, task, seed
    self.sandbox_factory = sandbox_factory
    self.attempt = attempt  # 0 for the first try; +1 per infrastructure retry
    self.sandbox = self.toolbox = None
    self.segments: list[Segment] = []
    self.current = SegmentBuilder()
    # The chat template and tool-call format the model speaks (c2jax's or its own).
    self.conv = conversation_lib.make_conversation(tokenizer, cfg)
    self.turns = self.summaries = self.total_tokens = 0
    self.seq_id: int | None = None
    # What the pending engine request returns: a model turn, a self-summary (same
    # sequence) or a compaction summary (a separate sequence).
    self.awaiting = "turn"
    # Transcript index of the current segment's first message after (system, task): a
    # compaction call reads the transcript from there.
    self.segment_start = 2
    self.compaction_tokens = 0  # prompt tokens of compaction calls (see Trajectory)
    self.finish_reason: str | None = None
    self.failed = False
    self.passed: dict[str, bool] = {}
    self.started = time.monotonic()
    self.stop_tokens = self.conv.stop_tokens

  @property
  def messages(self) -> list[dict]:
    return self.conv.transcript

  def retry(self) -> Episode:
    """The same task and seed from scratch, for a fresh sandbox (call after close)."""
    return Episode(self.cfg, self.tokenizer, self.task, self.seed, self.sandbox_factory,
                   self.attempt + 1)

  # ---- worker-thread work ---------------------------------------------------------------
  def start_work(self) -> np.ndarray:
    self.started = time.monotonic()  # wall time counts from the start, not the queue
    self.sandbox = self.sandbox_factory(self.task)
    reward_lib.prepare(self.sandbox, self.task)
    self.toolbox = tools_lib.Toolbox(self.sandbox, toolset(self.cfg))
    return self.conv.start(self.cfg.system_prompt, self.toolbox.specs(), self.task.prompt)

  def tools_work(self, text: str):
    return self.toolbox.run_turn(text, self.conv.format.parse_turn)

  def grade_work(self) -> None:
    try:
      self.passed, _ = reward_lib.run_hidden_tests(self.sandbox, self.task,
                                                   self.cfg.grade_timeout_s)
    finally:
      self.close()

  def close(self) -> None:
    if self.sandbox is not None:
      self.sandbox.close()
      self.sandbox = None

  # ---- main-thread transitions ----------------------------------------------------------
  def sampling(self, max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=self.cfg.temperature, top_k=self.cfg.top_k,
                          top_p=self.cfg.top_p, max_tokens=max(1, int(max_tokens)),
                          stop_tokens=self.stop_tokens, seed=self.seed)

  def turn_budget(self, engine, extra: int) -> int:
    room = engine.max_length - len(self.current) - extra - 1
    return min(self.cfg.max_turn_tokens, self.cfg.max_total_tokens - self.total_tokens, room)

  def record_turn(self, generation) -> str:
    """Books a model turn's tokens; returns its text (without the closing token)."""
    self.current.add(generation)
    self.total_tokens += len(generation.tokens)
    ids = generation.tokens
    body = ids[:-1] if len(ids) and ids[-1] in self.stop_tokens else ids
    return self.tokenizer.decode(body)

  def book_tools(self, generation, turn: protocol.Turn, observations) -> None:
    self.turns += 1
    counts = self.current.counts
    counts["turns"] += 1
    in_call = self.conv.turn_spans(generation.tokens)
    final = self.toolbox.finished or not turn.calls
    counts["tool_call_tokens"] += int(in_call.sum())
    counts["final_message_tokens" if final else "thinking_tokens"] += int((~in_call).sum())
    for observation in observations:
      name = observation.name
      self.current.tool_call_counts[name] = self.current.tool_call_counts.get(name, 0) + 1
      counts["tool_call_errors"] += int(not observation.ok)
    self.conv.book(turn, observations)

  def stop_reason(self, turn: protocol.Turn) -> str | None:
    """Why the episode ends after `turn` (its tools ran), or None to go on."""
    if self.toolbox.finished:
      return "finish"
    if not turn.calls:
      return "answer"
    if self.turns >= self.cfg.max_turns:
      return "max_turns"
    if self.total_tokens >= self.cfg.max_total_tokens:
      return "budget"
    return None

  def closing_ids(self, generation) -> np.ndarray:
    """The closing token a turn cut at max_tokens lacks (none if it closed itself), so
    the layout stays valid."""
    ids = generation.tokens
    closed = len(ids) and ids[-1] in self.stop_tokens
    return self.conv.close_ids[:0] if closed else self.conv.close_ids

  def observation_feed(self, generation) -> np.ndarray:
    """What follows a turn in the engine sequence: its closing token if cut, the tool
    results and the next generation prompt; booked as tool output tokens."""
    feed = np.concatenate([self.closing_ids(generation), self.conv.feed()]).astype(np.int32)
    self.current.counts["tool_output_tokens"] += len(feed)
    self.total_tokens += len(feed)
    return feed

  def out_of_room_reason(self) -> str:
    """Why a turn cannot fit: the chain's token budget, else the engine's context."""
    return "budget" if self.total_tokens >= self.cfg.max_total_tokens else "context"

  def close_segment(self) -> None:
    self.segments.append(self.current.build())
    self.current = SegmentBuilder()

  def record_summary(self, generation) -> np.ndarray:
    """Books a sampled self-summary (trained like any turn: it ends the segment), and
    returns the next segment's prompt: (system, task, header + summary)."""
    self.current.add(generation)
    self.total_tokens += len(generation.tokens)
    self.current.counts["thinking_tokens"] += len(generation.tokens)
    self.close_segment()
    summary = self._summary_ids(generation)
    self.conv.transcript.append({"role": "assistant", "content": self.tokenizer.decode(summary)})
    return self._restart(summary)

  def compaction_request(self, max_tokens: int) -> np.ndarray | None:
    """A compaction call's prompt: compaction_prompt, then the task and the current
    segment's messages as text (the latest tool results included), oldest cut to fit
    `max_tokens`; None if it cannot fit."""
    history = prompt_lib.history_text(self.task.prompt,
                                      self.conv.transcript[self.segment_start:])
    ids = self.conv.compaction_request(self.cfg.compaction_prompt, history, max_tokens)
    if ids is not None:
      self.compaction_tokens += len(ids)
    return ids

  def record_compaction(self, generation) -> np.ndarray:
    """Books a compaction call's summary (counted against the token budget, in no
    segment: never trained) and returns the next segment's prompt, as record_summary."""
    self.total_tokens += len(generation.tokens)
    return self._restart(self._summary_ids(generation))

  def _summary_ids(self, generation) -> np.ndarray:
    ids = generation.tokens
    return ids[:-1] if len(ids) and ids[-1] in self.stop_tokens else ids

  def _restart(self, summary: np.ndarray) -> np.ndarray:
    """The next segment's prompt: (system, task, header + summary)."""
    self.summaries += 1
    self.awaiting = "turn"
    self.segment_start = len(self.conv.transcript)
    self.conv.transcript.append(
        {"role": "user", "content": self.cfg.summary_header + self.tokenizer.decode(summary)})
    return self.conv.restart(self.cfg.summary_header, summary)

  def trajectory(self) -> Trajectory:
    stats = TrajectoryStats.of_chain([s.stats for s in self.segments])
    stats = dataclasses.replace(stats, tests_total=len(self.passed),
                                tests_passed=sum(self.passed.values()))
    return Trajectory(self.task.id, self.segments, stats, self.finish_reason,
                      self.messages, dict(self.passed), time.monotonic() - self.started,
                      self.attempt, self.total_tokens, self.compaction_tokens)
