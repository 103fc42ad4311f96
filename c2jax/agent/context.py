"""Context management of the agent loop (agent.context_management): when a segment is
summarised, and the engine request that asks for the summary.

A segment that reaches `summary_trigger_tokens` (or whose next turn has no room) is
summarised and a new segment starts from (system, task, summary); every segment is kept.
  'self_summary'  the policy writes the summary in its own sequence, a sampled (trained)
                  turn: the summary prompt is fed in place of the turn's observations
  'compaction'    (the baseline of report §4.1) a separate call of the model over the
                  history as text writes it; its tokens are in no segment
The scheduler of c2jax.agent.loop owns the engine: its named steps (ask_summary, compact,
on_summary, on_compaction) call these functions to decide and to build the request, and
the Episode books the summary that comes back (record_summary, record_compaction).
"""

from __future__ import annotations

import numpy as np

from c2jax.agent.episode import Episode


def wants_summary(cfg, episode: Episode, budget: int, fed: int) -> bool:
  """A summary is due: context management on, summaries left, token budget left (a
  summary cannot help a chain that has spent it), and the segment reaches the trigger
  with the next `fed` tokens (or the next turn has no room: `budget` < 1)."""
  return (cfg.context_management != "none"
          and episode.summaries < cfg.max_summaries
          and episode.total_tokens < cfg.max_total_tokens
          and (budget < 1 or len(episode.current) + fed >= cfg.summary_trigger_tokens))


def self_summary_request(cfg, episode: Episode, generation, fed: int,
                         max_length: int) -> tuple[np.ndarray, int] | None:
  """(tokens to append to the episode's sequence, max summary tokens) asking the policy
  for its self-summary in place of the `fed` observation tokens; booked on the episode
  (awaiting 'summary', the ask counted against the token budget instead of the
  observations). None, with nothing booked, when the engine sequence (`max_length`) or
  the token budget has no room for a summary."""
  ask = np.concatenate([episode.closing_ids(generation),
                        episode.conv.feed(cfg.summary_prompt)]).astype(np.int32)
  room = max_length - len(episode.current) - len(ask) - 1
  left = cfg.max_total_tokens - (episode.total_tokens + len(ask) - fed)
  max_tokens = min(cfg.summary_tokens, room, left)
  if max_tokens < 1:
    return None
  episode.awaiting = "summary"
  episode.total_tokens += len(ask) - fed
  return ask, max_tokens


def compaction_request(cfg, episode: Episode,
                       max_length: int) -> tuple[np.ndarray, int] | None:
  """(prompt of a fresh sequence, max summary tokens) of prompt-based compaction:
  compaction_prompt + the history as text, cut to fit `max_length` with the summary. The
  episode's segment is closed at the model's last turn and it awaits 'compaction' (the
  caller frees its sequence). None, with nothing changed, when not even the prompt fits
  or the token budget has no room for a summary."""
  max_tokens = min(cfg.summary_tokens, cfg.max_total_tokens - episode.total_tokens)
  prompt = (episode.compaction_request(max_length - max_tokens - 1)
            if max_tokens >= 1 else None)
  if prompt is None:
    return None
  episode.close_segment()
  episode.awaiting = "compaction"
  return prompt, max_tokens
