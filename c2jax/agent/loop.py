"""The agent loop, shared by RL rollouts and evaluation: model turns and tool calls.

    trajectories = run_episodes(engine, tokenizer, config.agent, tasks, seeds=[...])

Each episode runs one task in its own sandbox: the engine generates a turn, the sandbox's
tools run the turn's calls, their results are appended to the live engine sequence as
tokens (no prefix recompute), and so on until the model calls finish, answers without a
tool call, or runs out of turns, tokens or context. With agent.context_management, a
segment that grows past `summary_trigger_tokens` is summarised and a new segment starts
from (system, task, summary); every segment is kept (c2jax.agent.context: the trigger
and the summary requests, 'self_summary' or 'compaction'). Finally the hidden tests grade
the sandbox.

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
from collections.abc import Callable, Sequence

import numpy as np

from c2jax.agent import context
from c2jax.agent.episode import FINISH_REASONS, Episode, Segment, Trajectory
from c2jax.env import sandbox as sandbox_lib
from c2jax.env import tasks as tasks_lib
from c2jax.rollout.types import Request

__all__ = ["FINISH_REASONS", "EngineError", "PromptTooLongError", "RolloutError", "Segment",
           "Trajectory", "default_sandbox_factory", "run_episodes"]


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


def default_sandbox_factory(backend: str, disk_mb: int = 1024
                            ) -> Callable[[tasks_lib.Task], sandbox_lib.Sandbox]:
  return lambda task: sandbox_lib.make_task_sandbox(backend, task, disk_mb=disk_mb)


class _EpisodeScheduler:
  """Runs a call's episodes concurrently, one engine slot each, as named steps.

  The main thread owns the engine and every Episode; worker threads (`pool`) start
  sandboxes, run tool calls and grade. Each step below handles one event:
    start_more      a slot is free: start the next waiting episode's sandbox (worker)
    on_started      its prompt is ready: first engine request
    decode_step     one engine step for every active sequence, then on_step()
    on_turn         a model turn was sampled: run its tool calls (worker)
    on_tools        the tools ran: end the episode, summarise (past the trigger), or
                    feed the results and request the next turn
    ask_summary     (context_management='self_summary') ask in the episode's own sequence
    compact         (context_management='compaction') close the segment, ask a separate
                    sequence for a summary of the history
                    (when and what to ask: c2jax.agent.context)
    on_summary / on_compaction   the summary was sampled: start the next segment from it
    end / on_graded the episode stopped: grade it (worker), then record the trajectory
    fail            infrastructure failed: retry on a fresh sandbox, or give up
  """

  def __init__(self, engine, cfg, episodes: list[Episode],
               pool: concurrent.futures.Executor, *, infra_retries: int,
               on_step: Callable[[], None] | None,
               on_result: Callable[[int, Trajectory | RolloutError], None] | None,
               should_start: Callable[[], bool] | None = None):
    self.engine, self.cfg, self.episodes, self.pool = engine, cfg, episodes, pool
    self.should_start = should_start
    self.infra_retries, self.on_step, self.on_result = infra_retries, on_step, on_result
    self.waiting = list(range(len(episodes)))[::-1]  # popped from the end: task order
    self.by_seq: dict[int, int] = {}  # engine sequence -> episode, while a request is pending
    self.work: dict[concurrent.futures.Future, tuple[str, int, object]] = {}
    self.results: dict[int, Trajectory] = {}
    self.errors: list[str] = []  # infrastructure, beyond retries
    self.misconfigured: list[str] = []  # not infrastructure: retrying cannot help
    self.orphans: set[int] = set()  # engine requests of failed episodes, released on return
    self.engine_error: Exception | None = None
    self.live = self.retried = 0

  def run(self) -> None:
    """Until every episode has ended (or the engine failed): decode while any request is
    pending, and collect finished worker tasks in between (waiting for one when no
    request is pending)."""
    self.start_more()
    while self.live:
      if self.by_seq:
        if not self.decode_step():
          return
        timeout = 0
      elif self.work:
        timeout = None
      else:
        raise AssertionError("run_episodes: live episodes but no engine request or tool "
                             "work pending (a bug in the agent loop).")
      self.collect_work(timeout)
    self.drain_orphans()

  # ---- engine --------------------------------------------------------------------------
  def submit_engine(self, index: int, tokens, max_tokens: int, seq_id=None) -> None:
    """Requests `max_tokens` more tokens after `tokens`: a new sequence, or appended to
    the episode's live one (`seq_id`, kept alive between turns: no prefix recompute)."""
    episode = self.episodes[index]
    request = Request(tokens, episode.sampling(max_tokens), seq_id, keep_alive=True)
    episode.seq_id = self.engine.submit(request)
    self.by_seq[episode.seq_id] = index

  def release(self, episode: Episode) -> None:
    """Frees the episode's engine sequence (its slot)."""
    if episode.seq_id is not None:
      self.by_seq.pop(episode.seq_id, None)
      self.engine.release(episode.seq_id)
      episode.seq_id = None

  def decode_step(self) -> bool:
    """One engine step; routes each finished generation. False if the engine failed."""
    try:
      generations = self.engine.step()
    except Exception as e:  # pylint: disable=broad-except
      self.engine_error = e
      return False
    for generation in generations:
      if generation.seq_id in self.orphans:
        self.orphans.discard(generation.seq_id)
        self.engine.release(generation.seq_id)
        continue
      index = self.by_seq.pop(generation.seq_id, None)
      if index is None:
        continue
      awaiting = self.episodes[index].awaiting
      if awaiting == "summary":
        self.on_summary(index, generation)
      elif awaiting == "compaction":
        self.on_compaction(index, generation)
      else:
        self.on_turn(index, generation)
    if self.on_step is not None:
      self.on_step()
    return True

  def drain_orphans(self) -> None:
    """Failed episodes' requests still in the engine: step until they return, free them."""
    while self.orphans:
      for generation in self.engine.step():
        if generation.seq_id in self.orphans:
          self.orphans.discard(generation.seq_id)
          self.engine.release(generation.seq_id)

  # ---- worker tasks --------------------------------------------------------------------
  def submit_work(self, kind: str, index: int, fn, *args, context=None) -> None:
    self.work[self.pool.submit(fn, *args)] = (kind, index, context)

  def collect_work(self, timeout: float | None) -> None:
    """Hands every worker task finished within `timeout` to its step; a task that raised
    is an infrastructure failure of its episode."""
    done, _ = concurrent.futures.wait(list(self.work), timeout=timeout,
                                      return_when=concurrent.futures.FIRST_COMPLETED)
    for future in done:
      kind, index, context = self.work.pop(future)
      try:
        value = future.result()
      except Exception as e:  # pylint: disable=broad-except
        self.fail(index, f"{kind}: {type(e).__name__}: {e}")
        continue
      if kind == "started":
        self.on_started(index, value)
      elif kind == "tools":
        turn, observations = value
        self.on_tools(index, context, turn, observations)
      else:  # graded
        self.on_graded(index)

  # ---- episode steps -------------------------------------------------------------------
  def start_more(self) -> None:
    """Starts waiting episodes (sandbox + prompt, in a worker) while slots are free."""
    while (self.waiting and self.live < self.engine.num_slots
           and (self.should_start is None or self.should_start())):
      index = self.waiting.pop()
      self.live += 1
      self.submit_work("started", index, self.episodes[index].start_work)

  def on_started(self, index: int, prompt: np.ndarray) -> None:
    """The sandbox is up and the prompt built: request the first turn, unless the
    prompt alone leaves no room in the engine (not retried: a bigger engine is needed)."""
    budget = self.episodes[index].turn_budget(self.engine, len(prompt))
    if budget < 1:
      return self.fail(index, f"the prompt ({len(prompt)} tokens) leaves no room in the "
                       f"engine's max_length = {self.engine.max_length}; build the engine "
                       "with more.", infra=False)
    self.submit_engine(index, prompt, budget)

  def on_turn(self, index: int, generation) -> None:
    """A model turn came back: book its tokens, run its tool calls in a worker."""
    episode = self.episodes[index]
    text = episode.record_turn(generation)
    self.submit_work("tools", index, episode.tools_work, text, context=generation)

  def on_tools(self, index: int, generation, turn, observations) -> None:
    """The turn's tools ran: end the episode, or feed the results and request the next
    turn; when the segment passed the trigger or is out of room, summarise instead
    (agent.context_management)."""
    episode = self.episodes[index]
    episode.book_tools(generation, turn, observations)
    reason = episode.stop_reason(turn)
    if reason is not None:
      return self.end(index, reason)
    feed = episode.observation_feed(generation)
    budget = episode.turn_budget(self.engine, len(feed))
    if context.wants_summary(self.cfg, episode, budget, len(feed)):
      if self.cfg.context_management == "self_summary":
        summarised = self.ask_summary(index, generation, len(feed))
      else:
        summarised = self.compact(index)
      if summarised:
        return
    if budget < 1:
      return self.end(index, episode.out_of_room_reason())
    self.submit_engine(index, feed, budget, episode.seq_id)

  def ask_summary(self, index: int, generation, fed: int) -> bool:
    """Feeds the summary request instead of the `fed` observation tokens and requests the
    summary; False (nothing done) when the engine sequence or the token budget has no
    room for one."""
    episode = self.episodes[index]
    request = context.self_summary_request(self.cfg, episode, generation, fed,
                                           self.engine.max_length)
    if request is None:
      return False
    ask, max_tokens = request
    self.submit_engine(index, ask, max_tokens, episode.seq_id)
    return True

  def on_summary(self, index: int, generation) -> None:
    """The self-summary came back: it closes the segment; the next one starts from it."""
    episode = self.episodes[index]
    self.release(episode)
    self.start_segment(index, episode.record_summary(generation))

  def compact(self, index: int) -> bool:
    """Prompt-based compaction: close the segment at the model's last turn, free its
    sequence, and ask the model for a summary in a fresh sequence (compaction_prompt +
    the history as text). False (nothing done) when not even the prompt fits, or the
    token budget has no room for a summary."""
    episode = self.episodes[index]
    request = context.compaction_request(self.cfg, episode, self.engine.max_length)
    if request is None:
      return False
    prompt, max_tokens = request
    self.release(episode)
    self.submit_engine(index, prompt, max_tokens)
    return True

  def on_compaction(self, index: int, generation) -> None:
    """The compaction summary came back: free its sequence; the next segment starts
    from it."""
    episode = self.episodes[index]
    self.release(episode)
    self.start_segment(index, episode.record_compaction(generation))

  def start_segment(self, index: int, tokens: np.ndarray) -> None:
    """Requests the first turn of a new segment (prompt `tokens`, a new engine sequence),
    or ends the episode (grading it) when even that prompt leaves no room."""
    episode = self.episodes[index]
    budget = episode.turn_budget(self.engine, len(tokens))
    if budget < 1:
      episode.finish_reason = episode.out_of_room_reason()
      return self.submit_work("graded", index, episode.grade_work)
    self.submit_engine(index, tokens, budget)

  def end(self, index: int, reason: str) -> None:
    """The episode stopped (`reason`): free its slot, close its segment, grade it."""
    episode = self.episodes[index]
    episode.finish_reason = reason
    self.release(episode)
    episode.current.counts["unfinished_todos"] = episode.toolbox.open_todos
    episode.close_segment()
    self.submit_work("graded", index, episode.grade_work)

  def on_graded(self, index: int) -> None:
    """Hidden tests ran: the trajectory is done; its slot goes to the next episode."""
    self.results[index] = self.episodes[index].trajectory()
    if self.on_result is not None:
      self.on_result(index, self.results[index])
    self.live -= 1
    self.start_more()

  def fail(self, index: int, message: str, infra: bool = True) -> None:
    """Infrastructure failed this episode: retry it on a fresh sandbox or give up.
    infra=False: the setup cannot work (the prompt does not fit): no retry."""
    episode = self.episodes[index]
    if episode.seq_id is not None:
      if self.by_seq.pop(episode.seq_id, None) is not None:
        self.orphans.add(episode.seq_id)  # pending in the engine: released when it returns
      else:
        self.engine.release(episode.seq_id)
      episode.seq_id = None
    episode.close()
    episode.failed = True
    self.live -= 1
    if infra and episode.attempt < self.infra_retries:
      self.episodes[index] = episode.retry()
      self.waiting.append(index)  # next to start
      self.retried += 1
    elif not infra:
      self.give_up(index, PromptTooLongError(f"{episode.task.id}: {message}"),
                   self.misconfigured)
    else:
      message = f"{episode.task.id}: {message} (after {episode.attempt} retries)"
      self.give_up(index, RolloutError(message, episode.attempt), self.errors)
    self.start_more()

  def give_up(self, index: int, error: RolloutError, pile: list[str]) -> None:
    """Reports an episode that will not run: to on_result, else onto `pile` (raised at
    the end of the call)."""
    if self.on_result is None:
      pile.append(str(error))
    else:
      self.on_result(index, error)

  # ---- outcome -------------------------------------------------------------------------
  def outcome(self) -> list[Trajectory | None]:
    """The trajectories in task order, or the call's error (sandboxes closed)."""
    if self.engine_error is not None:
      for episode in self.episodes:
        episode.close()
      raise EngineError(f"The engine failed: {type(self.engine_error).__name__}: "
                        f"{self.engine_error}", self.retried) from self.engine_error
    if self.misconfigured:
      raise ValueError(f"{len(self.misconfigured)} episode(s) cannot run: "
                       + "; ".join(self.misconfigured[:5]))
    if self.errors:
      raise RolloutError(f"{len(self.errors)} episode(s) failed: "
                         + "; ".join(self.errors[:5]), self.retried)
    return [self.results.get(i) for i in range(len(self.episodes))]


def run_episodes(engine, tokenizer, cfg, tasks: Sequence[tasks_lib.Task], *,
                 seeds: Sequence[int | None] | None = None,
                 on_step: Callable[[], None] | None = None,
                 sandbox_factory=None, infra_retries: int = 0,
                 on_result: Callable[[int, Trajectory | RolloutError], None] | None = None,
                 should_start: Callable[[], bool] | None = None) -> list[Trajectory]:
  """Runs every task to the end (concurrently, at most engine.num_slots at a time) and
  returns their trajectories in task order. `cfg` is the agent config section.

  An episode whose sandbox fails is rerun on a fresh one up to `infra_retries` times.
  Raises RolloutError (after closing every sandbox) if infrastructure still failed, and
  EngineError if the engine did; a model's bad output is never an error, it is an
  observation the model gets back. With `on_result(index, trajectory_or_error)`, each
  episode is reported the moment it ends (evaluation streams results to disk), and one
  that failed beyond its retries, or whose prompt does not fit (PromptTooLongError), is
  reported there instead of being raised; the returned list then holds None for it.
  Once `should_start()` is False (evaluation was asked to stop), no further episode
  starts; those never started are not reported and hold None.
  """
  seeds = list(seeds) if seeds is not None else [None] * len(tasks)
  if len(seeds) != len(tasks):
    raise ValueError(f"run_episodes: {len(tasks)} tasks but {len(seeds)} seeds.")
  factory = sandbox_factory or default_sandbox_factory(cfg.backend, cfg.sandbox_disk_mb)
  episodes = [Episode(cfg, tokenizer, t, s, factory) for t, s in zip(tasks, seeds)]
  with concurrent.futures.ThreadPoolExecutor(cfg.tool_threads) as pool:
    scheduler = _EpisodeScheduler(engine, cfg, episodes, pool, infra_retries=infra_retries,
                                  on_step=on_step, on_result=on_result,
                                  should_start=should_start)
    scheduler.run()
  return scheduler.outcome()
