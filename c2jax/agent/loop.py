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

Infrastructure failures are not the model's doing: an episode whose sandbox fails (it
cannot start, crashes, or its tools raise sandbox.SandboxError) is retried from scratch
on a fresh sandbox, same task and seed, up to `infra_retries` times; if it still fails,
run_episodes raises RolloutError once the other episodes are done (the caller drops the
group, it is never scored). An engine failure raises EngineError (a RolloutError) at
once. A model's command that times out is an observation, not a failure.

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
from c2jax.agent import conversation as conversation_lib
from c2jax.toolcalls import protocol
from c2jax.env import reward as reward_lib
from c2jax.env import sandbox as sandbox_lib
from c2jax.env import tasks as tasks_lib
from c2jax.env import tools as tools_lib
from c2jax.agent.stats import TrajectoryStats
from c2jax.rollout.types import Request, SamplingParams

# finish: the model called finish; answer: a turn without tool calls (a final message);
# max_turns / budget (max_total_tokens) / context (the engine's max_length): cut off.
FINISH_REASONS = ("finish", "answer", "max_turns", "budget", "context")


class RolloutError(RuntimeError):
  """Infrastructure failed during an episode (e.g. a sandbox could not start), beyond
  its retries. `retries`: fresh-sandbox reruns spent in the whole call."""

  def __init__(self, message: str, retries: int = 0):
    super().__init__(message)
    self.retries = retries


class EngineError(RolloutError):
  """The inference engine failed; its state is suspect, so the caller should restart it."""


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
  infra_retries: int = 0  # fresh-sandbox restarts after infrastructure failures

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
               sandbox_factory: Callable[[tasks_lib.Task], sandbox_lib.Sandbox],
               attempt: int = 0):
    self.cfg, self.tokenizer, self.task, self.seed = cfg, tokenizer, task, seed
    self.sandbox_factory = sandbox_factory
    self.attempt = attempt  # 0 for the first try; +1 per infrastructure retry
    self.sandbox = self.toolbox = None
    self.segments: list[Segment] = []
    self.current = _SegmentBuilder()
    # The chat template and tool-call format the model speaks (c2jax's or its own).
    self.conv = conversation_lib.make_conversation(tokenizer, cfg)
    self.turns = self.summaries = self.total_tokens = 0
    self.seq_id: int | None = None
    self.summarising = False
    self.finish_reason: str | None = None
    self.failed = False
    self.passed: dict[str, bool] = {}
    self.started = time.monotonic()
    self.stop_tokens = self.conv.stop_tokens

  @property
  def messages(self) -> list[dict]:
    return self.conv.transcript

  def retry(self) -> _Episode:
    """The same task and seed from scratch, for a fresh sandbox (call after close)."""
    return _Episode(self.cfg, self.tokenizer, self.task, self.seed, self.sandbox_factory,
                    self.attempt + 1)

  # ---- worker-thread work ---------------------------------------------------------------
  def start_work(self) -> np.ndarray:
    self.started = time.monotonic()  # wall time counts from the start, not the queue
    self.sandbox = self.sandbox_factory(self.task)
    reward_lib.prepare(self.sandbox, self.task)
    self.toolbox = tools_lib.Toolbox(self.sandbox, agent_config.toolset(self.cfg))
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

  def close_segment(self) -> None:
    self.segments.append(self.current.build())
    self.current = _SegmentBuilder()

  def trajectory(self) -> Trajectory:
    stats = TrajectoryStats.of_chain([s.stats for s in self.segments])
    stats = dataclasses.replace(stats, tests_total=len(self.passed),
                                tests_passed=sum(self.passed.values()))
    return Trajectory(self.task.id, self.segments, stats, self.finish_reason,
                      self.messages, dict(self.passed), time.monotonic() - self.started,
                      self.attempt)


def default_sandbox_factory(backend: str) -> Callable[[tasks_lib.Task], sandbox_lib.Sandbox]:
  return lambda task: sandbox_lib.make_task_sandbox(backend, task)


def run_episodes(engine, tokenizer, cfg, tasks: Sequence[tasks_lib.Task], *,
                 seeds: Sequence[int | None] | None = None,
                 on_step: Callable[[], None] | None = None,
                 sandbox_factory=None, infra_retries: int = 0,
                 on_result: Callable[[int, Trajectory | RolloutError], None] | None = None
                 ) -> list[Trajectory]:
  """Runs every task to the end (concurrently, at most engine.num_slots at a time) and
  returns their trajectories in task order. `cfg` is the agent config section.

  An episode whose sandbox fails is rerun on a fresh one up to `infra_retries` times.
  Raises RolloutError (after closing every sandbox) if infrastructure still failed, and
  EngineError if the engine did; a model's bad output is never an error, it is an
  observation the model gets back. With `on_result(index, trajectory_or_error)`, each
  episode is reported the moment it ends (evaluation streams results to disk), and one
  that failed beyond its retries, or whose prompt does not fit (PromptTooLongError), is
  reported there instead of being raised; the returned list then holds None for it.
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
  misconfigured: list[str] = []  # not infrastructure: retrying cannot help
  orphans: set[int] = set()  # engine requests of failed episodes, released on return
  engine_error: Exception | None = None
  live = retried = 0

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
      # Cut at max_tokens: close the turn so the layout stays valid.
      close = episode.conv.close_ids[:0] if closed else episode.conv.close_ids
      feed = np.concatenate([close, episode.conv.feed()]).astype(np.int32)
      episode.current.counts["tool_output_tokens"] += len(feed)
      episode.total_tokens += len(feed)
      budget = episode.turn_budget(engine, len(feed))
      trigger = cfg.summary_trigger_tokens
      if trigger and episode.summaries < cfg.max_summaries and (
          budget < 1 or len(episode.current) + len(feed) >= trigger):
        ask = np.concatenate([close, episode.conv.feed(cfg.summary_prompt)]).astype(np.int32)
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
      episode.conv.transcript += [
          {"role": "assistant", "content": tokenizer.decode(summary)},
          {"role": "user", "content": cfg.summary_header + tokenizer.decode(summary)}]
      tokens = episode.conv.restart(cfg.summary_header, summary)
      budget = episode.turn_budget(engine, len(tokens))
      if budget < 1:
        episode.finish_reason = "context"
        return submit_work("graded", index, episode.grade_work)
      submit_engine(index, tokens, budget)

    def fail(index, message, infra=True):
      """Infrastructure failed this episode: retry it on a fresh sandbox or give up.
      infra=False: the setup cannot work (the prompt does not fit): no retry."""
      nonlocal live, retried
      episode = episodes[index]
      if episode.seq_id is not None:
        if by_seq.pop(episode.seq_id, None) is not None:
          orphans.add(episode.seq_id)  # pending in the engine: released when it returns
        else:
          engine.release(episode.seq_id)
        episode.seq_id = None
      episode.close()
      episode.failed = True
      live -= 1
      if infra and episode.attempt < infra_retries:
        episodes[index] = episode.retry()
        waiting.append(index)  # next to start
        retried += 1
      elif not infra:
        if on_result is None:
          misconfigured.append(f"{episode.task.id}: {message}")
        else:
          on_result(index, PromptTooLongError(f"{episode.task.id}: {message}"))
      else:
        message = f"{episode.task.id}: {message} (after {episode.attempt} retries)"
        if on_result is None:
          errors.append(message)
        else:
          on_result(index, RolloutError(message, episode.attempt))
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
        try:
          generations = engine.step()
        except Exception as e:  # pylint: disable=broad-except
          engine_error = e
          break
        for generation in generations:
          if generation.seq_id in orphans:
            orphans.discard(generation.seq_id)
            engine.release(generation.seq_id)
            continue
          index = by_seq.pop(generation.seq_id, None)
          if index is None:
            continue
          episode = episodes[index]
          if episode.summarising:
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
                 infra=False)
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
    while orphans and engine_error is None:  # failed episodes' requests: free their slots
      for generation in engine.step():
        if generation.seq_id in orphans:
          orphans.discard(generation.seq_id)
          engine.release(generation.seq_id)
  if engine_error is not None:
    for episode in episodes:
      episode.close()
    raise EngineError(f"The engine failed: {type(engine_error).__name__}: "
                      f"{engine_error}", retried) from engine_error
  if misconfigured:
    raise ValueError(f"{len(misconfigured)} episode(s) cannot run: "
                     + "; ".join(misconfigured[:5]))
  if errors:
    raise RolloutError(f"{len(errors)} episode(s) failed: " + "; ".join(errors[:5]),
                       retried)
  return [results.get(i) for i in range(len(episodes))]
