"""What every policy hands the runner: one finished (task, sample) episode, or an error.

A policy runs Jobs and reports an Outcome per job, or an InfraError when the
infrastructure (sandbox, endpoint, network) failed; the runner retries those and never
counts them as the model's failures.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable

from c2jax.env import tasks as tasks_lib


class InfraError(RuntimeError):
  """A transient failure outside the model: sandbox crash, endpoint timeout / 5xx /
  connection error. Retried `policy.retries` times, then recorded as infra_error."""


@dataclasses.dataclass(frozen=True)
class Job:
  task: tasks_lib.Task
  sample: int
  seed: int

  @property
  def key(self) -> tuple[str, int]:
    return (self.task.id, self.sample)


@dataclasses.dataclass
class Outcome:
  """A finished episode. Token counts are None where the policy cannot count them."""
  passed: dict[str, bool]  # hidden test / check id -> passed
  finish_reason: str
  messages: list[dict]  # OpenAI-style transcript
  turns: int
  tool_calls: int
  wall_s: float
  completion_tokens: int | None = None
  prompt_tokens: int | None = None
  cost: float | None = None
  extra: dict = dataclasses.field(default_factory=dict)


def final_answer(messages: list[dict]) -> str:
  """What the agent told the user: the message of its finish call when it has one,
  else the text of its last assistant message."""
  import json  # pylint: disable=g-import-not-at-top

  for message in reversed(messages):
    if message.get("role") != "assistant":
      continue
    for call in message.get("tool_calls") or []:
      if call["function"]["name"] == "finish":
        try:
          text = json.loads(call["function"]["arguments"] or "{}").get("message", "")
        except (ValueError, AttributeError):
          text = ""
        if text:
          return str(text)
    return message.get("content") or ""
  return ""


def tool_call_names(messages: list[dict]) -> list[str]:
  return [call["function"]["name"] for m in messages if m.get("role") == "assistant"
          for call in m.get("tool_calls") or []]



def run_in_threads(episode_fn, jobs, on_done, concurrency: int,
                   should_start: Callable[[], bool] | None = None, fatal=()) -> None:
  """Runs `episode_fn(job)` for every job on `concurrency` threads, reporting each outcome
  with `on_done(job, outcome)` as it ends; an exception is the job's InfraError (a sandbox
  that dies mid-episode raises from anywhere in the tools or grader). Once
  `should_start()` is False (a stop was requested), jobs not yet begun are skipped and not
  reported: a rerun runs them. An exception of a type in `fatal` cancels the rest and is
  raised.

  Each worker reports its episode before it takes the next job, so at any moment at most
  `concurrency` episodes are begun and not yet reported: after a stop, no more than that
  many results are still to come."""
  def guarded(job):
    if should_start is not None and not should_start():
      return
    try:
      outcome = episode_fn(job)
    except fatal:
      raise
    except InfraError as e:
      outcome = e
    except Exception as e:  # pylint: disable=broad-except
      outcome = InfraError(f"{type(e).__name__}: {e}")
    on_done(job, outcome)

  with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
    futures = [pool.submit(guarded, job) for job in jobs]
    for future in concurrent.futures.as_completed(futures):
      try:
        future.result()
      except BaseException:
        for other in futures:
          other.cancel()
        raise
