"""Captured requests of one external-harness episode -> the learner's Segments.

An external harness (mini-swe-agent, a script) sends whole conversations as text; `c2jax
serve --capture` records, per request, the prompt ids the engine was fed and the ids it
sampled (c2jax/serve/capture.py). A multi-turn episode normally re-sends its history, so
request n+1's prompt starts with request n's prompt + completion. Stitching joins such
requests by exact token prefixes -- no re-tokenisation, so the learner trains on exactly
the ids the policy saw and emitted -- and starts a new segment whenever a prompt does not
extend the tokens so far (the harness edited or truncated its history, or the chat
template rendered a turn differently from how it was sampled). Every segment is trained
on the chain's one reward, like the self-summary segments of native rollouts.

Per token of a segment: loss_mask 1 on sampled ids; sampler log-probs and policy versions
from the request that sampled it; router indices from the request that first fed it (the
last sampled id of a request is fed by the next request, which therefore supplies its row).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from c2jax.agent.loop import Segment
from c2jax.agent.stats import TrajectoryStats


class _Open:
  """The segment being stitched, as growing arrays."""

  def __init__(self, row: dict):
    prompt, completion = row["prompt_ids"], row["completion_ids"]
    self.tokens = np.concatenate([prompt, completion]).astype(np.int32)
    self.mask = np.concatenate([np.zeros(len(prompt), np.int32),
                                np.ones(len(completion), np.int32)])
    self.logprobs = np.concatenate([np.zeros(len(prompt), np.float32),
                                    row["logprobs"].astype(np.float32)])
    self.versions = np.concatenate([np.full(len(prompt), -1, np.int32),
                                    row["versions"].astype(np.int32)])
    self.routing = _routing(row).copy()
    self.first_prompt = len(prompt)
    self.fed = 0  # tokens fed after the first prompt (tool outputs, user turns)
    self.sampled = [len(completion)]

  def extends(self, row: dict) -> bool:
    prompt = row["prompt_ids"]
    n = len(self.tokens)
    return len(prompt) >= n and np.array_equal(prompt[:n], self.tokens)

  def add(self, row: dict) -> None:
    n = len(self.tokens)
    prompt, completion = row["prompt_ids"], row["completion_ids"]
    new = len(prompt) - n
    routing = _routing(row)
    if n and len(self.mask) and self.mask[-1] == 1:
      self.routing[n - 1] = routing[n - 1]  # the last sampled id was fed here
    self.tokens = np.concatenate([self.tokens, prompt[n:], completion]).astype(np.int32)
    self.mask = np.concatenate([self.mask, np.zeros(new, np.int32),
                                np.ones(len(completion), np.int32)])
    self.logprobs = np.concatenate([self.logprobs, np.zeros(new, np.float32),
                                    row["logprobs"].astype(np.float32)])
    self.versions = np.concatenate([self.versions, np.full(new, -1, np.int32),
                                    row["versions"].astype(np.int32)])
    self.routing = np.concatenate([self.routing, routing[n:]])
    self.fed += new
    self.sampled.append(len(completion))

  def build(self, last: bool) -> Segment:
    sampled = sum(self.sampled)
    # Without the harness's parse of each turn, a chain's last reply counts as its final
    # message and every earlier sampled token as work (thinking + tool calls).
    final = self.sampled[-1] if last else 0
    stats = TrajectoryStats(thinking_tokens=sampled - final, final_message_tokens=final,
                            tool_output_tokens=self.fed, turns=len(self.sampled))
    return Segment(self.tokens, self.mask, self.logprobs, self.versions,
                   self.routing.astype(np.int32), stats)


def _routing(row: dict) -> np.ndarray:
  routing = np.asarray(row["expert_indices"], np.int32)
  expected = len(row["prompt_ids"]) + len(row["completion_ids"])
  if routing.shape[0] != expected:
    raise ValueError(f"captured request {row.get('id')!r}: expert_indices has "
                     f"{routing.shape[0]} rows for {expected} prompt + completion tokens; "
                     "the capture file is corrupt or from another server version.")
  return routing


def episode_rows(rows: Sequence[dict], model: str) -> list[dict]:
  """The captured requests one episode sent (those naming `model`, e.g. 'tiny@ep-3'),
  in the order they were made."""
  mine = [row for row in rows if row["model"] == model]
  return sorted(mine, key=lambda row: row["created"])


def stitch(rows: Sequence[dict]) -> list[Segment]:
  """Segments of one episode's captured requests (in request order; see episode_rows).
  Requests that sampled nothing still extend the context but add no trained token."""
  segments: list[_Open] = []
  for row in rows:
    if segments and segments[-1].extends(row):
      segments[-1].add(row)
    else:
      segments.append(_Open(row))
  return [s.build(last=i == len(segments) - 1) for i, s in enumerate(segments)]
