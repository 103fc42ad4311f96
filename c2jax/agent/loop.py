"""The agent loop, shared by RL rollouts and evaluation: model turns and tool calls.

    trajectories = run_episodes(engine, tokenizer, config.agent, tasks, seeds=[...])

Each episode runs one task in its own sandbox: the engine generates a turn, the sandbox's
tools run the turn's calls, their results are appended to the live engine sequence as
tokens (no prefix recompute), and so on until the model calls finish, answers without a
tool call, or runs out of turns, tokens or context. With `summary_trigger_tokens`, a
segment that grows past the trigger is asked for a self-summary; a new segment then
starts from (system, task, summary), and every segment is kept. Finally the hidden tests
grade the sandbox.

Episodes run concurrently, one engine slot each: the engine decodes every active
sequence in one step while tool calls and grading run in worker threads, so a slow test
run never stalls decoding. `on_step()` is called after every decode step (RL actors swap
in new weights there: in-flight updates).

Token in, token out: a Segment holds exactly the ids the engine saw and sampled, with the
sampler's log-probabilities, policy versions and expert indices per token; loss_mask is 1
on sampled tokens only.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np

from c2jax.agent import config as agent_config
from c2jax.agent import prompt as prompt_lib
from c2jax.agent import protocol
from c2jax.env import reward as reward_lib
from c2jax.env import sandbox as sandbox_lib
from c2jax.env import tasks as tasks_lib
from c2jax.env import tools as tools_lib
from c2jax.rl.rewards import TrajectoryStats
from c2jax.rollout.types import Request, SamplingParams

# finish: the model called finish; answer: a turn without tool calls (a final message);
# max_turns / budget (max_total_tokens) / context (the engine's max_length): cut off.
FINISH_REASONS = ("finish", "answer", "max_turns", "budget", "context")


class RolloutError(RuntimeError):
  """Infrastructure failed during an episode (e.g. a sandbox could not start)."""


class PromptTooLongError(RolloutError):
  """The task's prompt does not fit the engine's max_length: no infrastructure will fix
  that, so evaluation scores it as a failure (finish reason 'context') instead of
  retrying."""


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

  @property
  def solved(self) -> bool:
    return bool(self.passed) and all(self.passed.values())

  @property
  def policy_version(self) -> int:
    """The oldest policy version that sampled any token (-1 when none was sampled)."""
    sampled = [s.versions[s.loss_mask > 0] for s in self.segments]
    sampled = np.concatenate(sampled) if sampled else np.zeros(0, np.int32)
    return int(sampled.min()) if sampled.size else -1


class _SegmentBuilder:
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


class _Episode:
  """One task's rollout as a state machine driven by `run_episodes` (main thread only,
  except the `*_work` methods, which run in a worker thread)."""

  def __init__(self, cfg, tokenizer, task: tasks_lib.Task, seed: int | None,
               sandbox_factory: Callable[[tasks_lib.Task], sandbox_lib.Sandbox]):
    self.cfg, self.tokenizer, self.task, self.seed = cfg, tokenizer, task, seed
    self.sandbox_factory = sandbox_factory
    self.sandbox = self.toolbox = None
    self.system = ""
    self.segments: list[Segment] = []
    self.current = _SegmentBuilder()
    self.messages: list[dict] = []
    self.turns = self.summaries = self.total_tokens = 0
    self.seq_id: int | None = None
    self.summarising = False
    self.finish_reason: str | None = None
    self.failed = False
    self.passed: dict[str, bool] = {}
    self.started = time.monotonic()
    specials = tokenizer.specials
    self.end_id = tokenizer.token_id(specials.end)
    self.stop_tokens = (self.end_id, tokenizer.token_id(specials.eos))

  # ---- worker-thread work ---------------------------------------------------------------
  def start_work(self) -> np.ndarray:
    self.started = time.monotonic()  # wall time counts from the start, not the queue
    self.sandbox = self.sandbox_factory(self.task)
    reward_lib.prepare(self.sandbox, self.task)
    self.toolbox = tools_lib.Toolbox(self.sandbox, agent_config.toolset(self.cfg))
    self.system = prompt_lib.system_message(self.cfg.system_prompt, self.toolbox.specs())
    self.messages = prompt_lib.initial_messages(self.system, self.task.prompt)
    return prompt_lib.prompt_ids(self.tokenizer, self.system, self.task.prompt)

  def tools_work(self, text: str):
    return self.toolbox.run_turn(text)

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
    """Books a model turn's tokens; returns its text (without the closing <|end|>)."""
    self.current.add(generation)
    self.total_tokens += len(generation.tokens)
    ids = generation.tokens
    body = ids[:-1] if len(ids) and ids[-1] in self.stop_tokens else ids
    return self.tokenizer.decode(body)

  def book_tools(self, generation, turn: protocol.Turn, observations) -> None:
    self.turns += 1
    counts = self.current.counts
    counts["turns"] += 1
    in_call = prompt_lib.turn_spans(self.tokenizer, generation.tokens)
    final = self.toolbox.finished or not turn.calls
    counts["tool_call_tokens"] += int(in_call.sum())
    counts["final_message_tokens" if final else "thinking_tokens"] += int((~in_call).sum())
    for observation in observations:
      name = observation.name
      self.current.tool_call_counts[name] = self.current.tool_call_counts.get(name, 0) + 1
      counts["tool_call_errors"] += int(not observation.ok)
    self.messages += protocol.to_openai_messages(turn, observations, self.turns - 1)

  def close_segment(self) -> None:
    self.segments.append(self.current.build())
    self.current = _SegmentBuilder()

  def trajectory(self) -> Trajectory:
    stats = TrajectoryStats.of_chain([s.stats for s in self.segments])
    stats = dataclasses.replace(stats, tests_total=len(self.passed),
                                tests_passed=sum(self.passed.values()))
    return Trajectory(self.task.id, self.segments, stats, self.finish_reason,
                      self.messages, dict(self.passed), time.monotonic() - self.started)


def default_sandbox_factory(backend: str) -> Callable[[tasks_lib.Task], sandbox_lib.Sandbox]:
  return lambda task: sandbox_lib.make_sandbox(backend, task.repo)


def run_episodes(engine, tokenizer, cfg, tasks: Sequence[tasks_lib.Task], *,
                 seeds: Sequence[int | None] | None = None,
                 on_step: Callable[[], None] | None = None,
                 sandbox_factory=None,
                 on_result: Callable[[int, Trajectory | RolloutError], None] | None = None
                 ) -> list[Trajectory]:
  """Runs every task to the end (concurrently, at most engine.num_slots at a time) and
  returns their trajectories in task order. `cfg` is the agent config section.

  Raises RolloutError (after closing every sandbox) if infrastructure failed; a model's
  bad output is never an error, it is an observation the model gets back. With
  `on_result(index, trajectory_or_error)`, each episode is reported the moment it ends
  (evaluation streams results to disk) and a failed one is reported there as a
  RolloutError instead of being raised; the returned list then holds None for it.
  """
  seeds = list(seeds) if seeds is not None else [None] * len(tasks)
  if len(seeds) != len(tasks):
    raise ValueError(f"run_episodes: {len(tasks)} tasks but {len(seeds)} seeds.")
  factory = sandbox_factory or default_sandbox_factory(cfg.backend)
  episodes = [_Episode(cfg, tokenizer, t, s, factory) for t, s in zip(tasks, seeds)]
  waiting = list(range(len(episodes)))[::-1]
  by_seq: dict[int, int] = {}  # engine sequence -> episode, while a request is pending
  work: dict[concurrent.futures.Future, tuple[str, int, object]] = {}
  results: dict[int, Trajectory] = {}
  errors: list[str] = []
  live = 0

  with concurrent.futures.ThreadPoolExecutor(cfg.tool_threads) as pool:

    def submit_work(kind, index, fn, *args, context=None):
      work[pool.submit(fn, *args)] = (kind, index, context)

    def submit_engine(index, tokens, max_tokens, seq_id=None):
      episode = episodes[index]
      request = Request(tokens, episode.sampling(max_tokens), seq_id, keep_alive=True)
      episode.seq_id = engine.submit(request)
      by_seq[episode.seq_id] = index

    def release(episode):
      if episode.seq_id is not None:
        by_seq.pop(episode.seq_id, None)
        engine.release(episode.seq_id)
        episode.seq_id = None

    def end(index, reason):
      episode = episodes[index]
      episode.finish_reason = reason
      release(episode)
      episode.current.counts["unfinished_todos"] = episode.toolbox.open_todos
      episode.close_segment()
      submit_work("graded", index, episode.grade_work)

    def after_tools(index, generation, turn, observations):
      episode = episodes[index]
      episode.book_tools(generation, turn, observations)
      if episode.toolbox.finished:
        return end(index, "finish")
      if not turn.calls:
        return end(index, "answer")
      if episode.turns >= cfg.max_turns:
        return end(index, "max_turns")
      if episode.total_tokens >= cfg.max_total_tokens:
        return end(index, "budget")
      closed = len(generation.tokens) and generation.tokens[-1] in episode.stop_tokens
      feed = prompt_lib.observation_ids(tokenizer, observations)
      if not closed:  # cut at max_tokens: close the turn so the layout stays valid
        feed = np.concatenate([[episode.end_id], feed]).astype(np.int32)
      episode.current.counts["tool_output_tokens"] += len(feed)
      episode.total_tokens += len(feed)
      budget = episode.turn_budget(engine, len(feed))
      trigger = cfg.summary_trigger_tokens
      if trigger and episode.summaries < cfg.max_summaries and (
          budget < 1 or len(episode.current) + len(feed) >= trigger):
        ask = np.concatenate([feed, prompt_lib.summary_request_ids(
            tokenizer, cfg.summary_prompt)]).astype(np.int32)
        room = engine.max_length - len(episode.current) - len(ask) - 1
        if room >= 1:
          episode.summarising = True
          episode.total_tokens += len(ask) - len(feed)
          return submit_engine(index, ask, min(cfg.summary_tokens, room), episode.seq_id)
      if budget < 1:
        return end(index, "budget" if episode.total_tokens >= cfg.max_total_tokens
                   else "context")
      submit_engine(index, feed, budget, episode.seq_id)

    def after_summary(index, generation):
      episode = episodes[index]
      episode.current.add(generation)
      episode.total_tokens += len(generation.tokens)
      episode.current.counts["thinking_tokens"] += len(generation.tokens)
      release(episode)
      episode.close_segment()
      episode.summaries += 1
      episode.summarising = False
      ids = generation.tokens
      summary = ids[:-1] if len(ids) and ids[-1] in episode.stop_tokens else ids
      episode.messages += [
          {"role": "assistant", "content": tokenizer.decode(summary)},
          {"role": "user", "content": cfg.summary_header + tokenizer.decode(summary)}]
      extra = np.concatenate([tokenizer.encode(cfg.summary_header), summary])
      tokens = prompt_lib.prompt_ids(tokenizer, episode.system, episode.task.prompt, extra)
      budget = episode.turn_budget(engine, len(tokens))
      if budget < 1:
        episode.finish_reason = "context"
        return submit_work("graded", index, episode.grade_work)
      submit_engine(index, tokens, budget)

    def fail(index, message, error_type=RolloutError):
      nonlocal live
      episode = episodes[index]
      errors.append(f"{episode.task.id}: {message}")
      episode.failed = True
      if on_result is not None:
        on_result(index, error_type(f"{episode.task.id}: {message}"))
      if episode.seq_id is not None and episode.seq_id not in by_seq:
        release(episode)  # idle in the engine; a pending one is released when it returns
      episode.close()
      live -= 1
      start_more()

    def start_more():
      nonlocal live
      while waiting and live < engine.num_slots:
        index = waiting.pop()
        live += 1
        submit_work("started", index, episodes[index].start_work)

    start_more()
    while live:
      if by_seq:
        for generation in engine.step():
          index = by_seq.pop(generation.seq_id, None)
          if index is None:
            continue
          episode = episodes[index]
          if episode.failed:
            release(episode)
          elif episode.summarising:
            after_summary(index, generation)
          else:
            text = episode.record_turn(generation)
            submit_work("tools", index, episode.tools_work, text, context=generation)
        if on_step is not None:
          on_step()
        timeout = 0
      elif work:
        timeout = None
      else:
        raise AssertionError("run_episodes: live episodes but no engine request or tool "
                             "work pending (a bug in the agent loop).")
      done, _ = concurrent.futures.wait(list(work), timeout=timeout,
                                        return_when=concurrent.futures.FIRST_COMPLETED)
      for future in done:
        kind, index, context = work.pop(future)
        episode = episodes[index]
        try:
          value = future.result()
        except Exception as e:  # pylint: disable=broad-except
          fail(index, f"{kind}: {type(e).__name__}: {e}")
          continue
        if kind == "started":
          budget = episode.turn_budget(engine, len(value))
          if budget < 1:
            fail(index, f"the prompt ({len(value)} tokens) leaves no room in the engine's "
                 f"max_length = {engine.max_length}; build the engine with more.",
                 PromptTooLongError)
            continue
          submit_engine(index, value, budget)
        elif kind == "tools":
          turn, observations = value
          after_tools(index, context, turn, observations)
        else:  # graded
          results[index] = episode.trajectory()
          if on_result is not None:
            on_result(index, results[index])
          live -= 1
          start_more()
    while by_seq:  # requests of failed episodes: let them finish, then free their slots
      for generation in engine.step():
        if by_seq.pop(generation.seq_id, None) is not None:
          engine.release(generation.seq_id)
  if errors and on_result is None:
    raise RolloutError(f"{len(errors)} episode(s) failed: " + "; ".join(errors[:5]))
  return [results.get(i) for i in range(len(episodes))]
