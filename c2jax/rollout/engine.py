"""The Engine interface and its slot scheduler (continuous batching), backend-agnostic.

An engine holds `num_slots` sequence slots, each with room for `max_length` tokens of KV
cache. Requests queue until a slot is free; `step()` first admits queued requests
(prefilling their tokens, several to a call where the backend can), then runs one decode
call over every slot, so sequences of different lengths join and leave independently.
Between steps, staged weights from `update_params` are swapped in: sequences in flight
keep their KV cache and continue with the new weights, and tokens sampled afterwards
carry the new version.

Sequence lifecycle: generating (a sampled token is pending, not yet in the cache) ->
draining (finished; the pending token is fed once more so its expert routing is recorded
and the cache holds the whole sequence) -> idle (kept for `extend`) or released.

Backends implement `_append` (prefill / extend of one slot; `_append_many` may batch
several slots into fewer calls), `_decode` (one call over all slots; a speculative or
multi-step backend may emit several tokens per slot, see SlotOutput), `_set_params` and
`logprobs`. The host applies every stop rule to what a call returns, vectorised over its
tokens, and ends a sequence exactly at its first stop. JaxEngine (jax_engine.py) runs the
model; FakeEngine (fake.py) is a deterministic stand-in for tests of code that drives an
engine.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import threading
from collections.abc import Callable, Sequence

import numpy as np

from c2jax.rollout.types import Generation, Request, SamplingParams


@dataclasses.dataclass
class DecodeBatch:
  """Per-slot inputs of one decode step (S = num_slots). Inactive slots must not write."""
  tokens: np.ndarray  # [S] int32: the pending token of each active slot
  lengths: np.ndarray  # [S] int32: its position (= tokens already in the cache)
  active: np.ndarray  # [S] bool
  temperature: np.ndarray  # [S] float32
  top_k: np.ndarray  # [S] int32
  top_p: np.ndarray  # [S] float32
  seeds: np.ndarray  # [S] uint32
  # For backends that run several steps per call and stop slots on device (a backend
  # running one step may ignore these; the host applies every stop rule either way):
  draining: np.ndarray  # [S] bool: active slots that only feed their final token
  stop_tokens: np.ndarray  # [S, W] int32: each slot's stop tokens, padded with -1
  budget: np.ndarray  # [S] int32: tokens each generating slot may still sample
  # Slots whose request wants its log-probs (SamplingParams.logprobs); a backend may skip
  # computing them when no active slot does (the host reports NaN for the others).
  logprobs: np.ndarray  # [S] bool
  # Whether an active slot has a stop rule only the host can apply (stop strings): a
  # multi-step backend then returns sooner, sampling less past a stop it cannot see.
  host_stops: bool = False


@dataclasses.dataclass
class SlotOutput:
  """One active slot's decode result: F fed tokens (the pending one first) and the token
  sampled after each; a plain step has F = 1, a speculative one F = a + 1 (the accepted
  drafts are fed), a multi-step chunk F = the steps the slot ran. new_tokens[i] is fed
  as token i + 1, so the host can end the sequence after any of them."""
  new_tokens: np.ndarray  # [F] int32
  new_logprobs: np.ndarray  # [F] float32
  fed_routing: np.ndarray  # [F, Lm, K] int32


@dataclasses.dataclass
class _Sequence:
  seq_id: int
  slot: int | None
  context: list[int]  # every token of the sequence, pending one included
  length: int  # tokens in the KV cache
  state: str  # 'queued' | 'generating' | 'draining' | 'idle'
  request: Request | None = None
  seed: int = 0
  prompt_tokens: np.ndarray | None = None
  new_tokens: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)
  # Chunks [n, Lm, K] of the fed tokens' routing, in order (one per call: joined once, at
  # the end, not one array per token).
  routing: list[np.ndarray] = dataclasses.field(default_factory=list)
  finish_reason: str | None = None


class Engine(abc.ABC):
  """generate / extend / logprobs / update_params over slot-based continuous batching."""

  def __init__(self, num_slots: int, max_length: int,
               detokenize: Callable[[Sequence[int]], str] | None = None, seed: int = 0):
    if num_slots < 1 or max_length < 2:
      raise ValueError(f"num_slots = {num_slots}, max_length = {max_length}: an engine "
                       "needs at least 1 slot and room for 2 tokens.")
    self.num_slots, self.max_length = num_slots, max_length
    self._detokenize = detokenize
    self._seed_rng = np.random.default_rng(seed)
    self._free = collections.deque(range(num_slots))
    self._seqs: dict[int, _Sequence] = {}
    self._queue: collections.deque[_Sequence] = collections.deque()
    self._unclaimed: list[Generation] = []
    self._next_id = 0
    self._version = 0
    self._staged = None
    self._lock = threading.Lock()

  # ---- backend hooks -------------------------------------------------------------------
  @abc.abstractmethod
  def _append(self, slot: int, context: list[int], start: int,
              sampling: SamplingParams, seed: int) -> tuple[int, float, np.ndarray]:
    """Writes context[start:] at positions start.. of `slot`; samples the next token.

    Returns (token, logprob, routing [len(context) - start, Lm, K]).
    """

  def _append_many(self, items: Sequence[tuple[int, list[int], int, SamplingParams, int]]
                   ) -> list[tuple[int, float, np.ndarray]]:
    """`_append` for several slots at once ((slot, context, start, sampling, seed) each;
    distinct slots), results in order. A backend overrides it to prefill them in fewer
    calls; the results must be what `_append` gives for each alone."""
    return [self._append(*item) for item in items]

  @abc.abstractmethod
  def _decode(self, batch: DecodeBatch) -> dict[int, SlotOutput]:
    """One call over all slots (one or more steps); outputs for the active ones, keyed by
    slot."""

  @abc.abstractmethod
  def _set_params(self, params) -> None:
    """Installs new weights (same structure) for the following steps."""

  @abc.abstractmethod
  def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Teacher-forced log p(x_t | x_<t) for t >= 1 of each sequence ([len - 1] float32)."""

  # ---- public API -----------------------------------------------------------------------
  @property
  def version(self) -> int:
    return self._version

  def update_params(self, params, version: int) -> None:
    """Stages new weights; the next `step` installs them (safe from another thread)."""
    with self._lock:
      self._staged = (params, int(version))

  def submit(self, request: Request) -> int:
    """Queues a request; returns its sequence id. Work happens in `step`."""
    tokens = [int(t) for t in np.asarray(request.tokens, np.int64).reshape(-1)]
    if not tokens:
      raise ValueError("Request.tokens is empty; a prompt or observation needs >= 1 token.")
    if request.sampling.stop_strings and self._detokenize is None:
      raise ValueError("SamplingParams.stop_strings needs a detokenizer: build the engine "
                       "with detokenize=tokenizer.decode.")
    seed = request.sampling.seed
    seed = int(self._seed_rng.integers(2**31)) if seed is None else int(seed)
    if request.seq_id is None:
      seq = _Sequence(self._next_id, None, [], 0, "queued")
      self._next_id += 1
      self._seqs[seq.seq_id] = seq
    else:
      seq = self._seqs.get(request.seq_id)
      if seq is None or seq.state != "idle":
        raise ValueError(f"Cannot extend sequence {request.seq_id}: it is "
                         f"{'unknown or released' if seq is None else seq.state}. Only a "
                         "finished sequence generated with keep_alive=True can be extended.")
      seq.state = "queued"
    start = len(seq.context)
    if start + len(tokens) + 1 > self.max_length:
      if request.seq_id is None:
        del self._seqs[seq.seq_id]
      else:
        seq.state = "idle"
      raise ValueError(f"Sequence {seq.seq_id} would hold {start + len(tokens)} tokens plus "
                       f"one to sample, over max_length = {self.max_length}; build the "
                       "engine with a larger max_length or shorten the input.")
    seq.request, seq.seed = request, seed
    seq.prompt_tokens = np.asarray(tokens, np.int32)
    seq.new_tokens, seq.logprobs, seq.versions, seq.routing = [], [], [], []
    seq.finish_reason = None
    self._queue.append(seq)
    return seq.seq_id

  def step(self) -> list[Generation]:
    """Swaps staged weights, admits queued requests, runs one decode step; returns the
    generations that finished (including earlier unclaimed ones)."""
    with self._lock:
      staged, self._staged = self._staged, None
    if staged is not None:
      self._set_params(staged[0])
      self._version = staged[1]
    finished, self._unclaimed = self._unclaimed, []
    self._admit()
    running = {s.slot: s for s in self._seqs.values() if s.state in ("generating", "draining")}
    if running:
      outputs = self._decode(self._batch(running))
      for slot, seq in running.items():
        done = self._absorb(seq, outputs[slot])
        if done:
          finished.append(self._finish(seq))
    return finished

  def generate(self, requests: Sequence[Request]) -> list[Generation]:
    """Runs the requests to completion; generations in request order."""
    ids = [self.submit(r) for r in requests]
    wanted, results = set(ids), {}
    while wanted - set(results):
      for generation in self.step():
        if generation.seq_id in wanted:
          results[generation.seq_id] = generation
        else:
          self._unclaimed.append(generation)
    return [results[i] for i in ids]

  def extend(self, seq_id: int, tokens, sampling: SamplingParams = SamplingParams(),
             keep_alive: bool = True) -> Generation:
    """Appends tokens (e.g. a tool observation) to a live sequence and samples on."""
    return self.generate([Request(tokens, sampling, seq_id, keep_alive)])[0]

  def release(self, seq_id: int) -> None:
    """Frees an idle sequence's slot."""
    seq = self._seqs.get(seq_id)
    if seq is None or seq.state != "idle":
      raise ValueError(f"Cannot release sequence {seq_id}: only idle (finished, kept "
                       "alive) sequences can be released.")
    self._free.append(seq.slot)
    del self._seqs[seq_id]

  def cancel(self, seq_id: int) -> None:
    """Abandons a queued, running or idle sequence and frees its slot (e.g. a server's
    client went away mid-generation). Its tokens are dropped; nothing is returned."""
    seq = self._seqs.pop(seq_id, None)
    if seq is None:
      raise ValueError(f"Cannot cancel sequence {seq_id}: it is unknown or already "
                       "finished and released.")
    self._queue = collections.deque(s for s in self._queue if s is not seq)
    if seq.slot is not None:
      self._free.append(seq.slot)
    self._unclaimed = [g for g in self._unclaimed if g.seq_id != seq_id]

  def progress(self, seq_id: int) -> tuple[list[int], list[float]]:
    """(tokens, logprobs) sampled so far by a live sequence's current request: what a
    streaming consumer can show between steps. The final Generation is authoritative."""
    seq = self._seqs.get(seq_id)
    if seq is None:
      raise ValueError(f"Sequence {seq_id} is unknown or released.")
    return list(seq.new_tokens), list(seq.logprobs)

  @property
  def busy(self) -> bool:
    """True while any request is queued or generating (another `step` has work)."""
    return bool(self._queue) or any(s.state in ("generating", "draining")
                                    for s in self._seqs.values())

  # ---- scheduling -------------------------------------------------------------------------
  def _admit(self) -> None:
    """Gives queued requests free slots and prefills them together (_append_many)."""
    waiting, admitted = collections.deque(), []
    while self._queue:
      seq = self._queue.popleft()
      if seq.slot is None:
        if not self._free:
          waiting.append(seq)
          continue
        seq.slot = self._free.popleft()
      admitted.append((seq, len(seq.context)))
      seq.context.extend(int(t) for t in seq.prompt_tokens)
    self._queue = waiting
    results = self._append_many([(seq.slot, seq.context, start, seq.request.sampling,
                                  seq.seed) for seq, start in admitted])
    for (seq, _), (token, logprob, routing) in zip(admitted, results):
      seq.length = len(seq.context)
      seq.routing.append(np.asarray(routing))
      seq.state = "generating"
      self._take(seq, np.int32([token]), np.float32([logprob]))

  def _batch(self, running: dict[int, _Sequence]) -> DecodeBatch:
    s = self.num_slots
    width = max([len(seq.request.sampling.stop_tokens) for seq in running.values()] + [1])
    width = 1 << (width - 1).bit_length()  # a few compiled widths, not one per request
    batch = DecodeBatch(
        tokens=np.zeros(s, np.int32), lengths=np.zeros(s, np.int32), active=np.zeros(s, bool),
        temperature=np.ones(s, np.float32), top_k=np.zeros(s, np.int32),
        top_p=np.ones(s, np.float32), seeds=np.zeros(s, np.uint32),
        draining=np.zeros(s, bool), stop_tokens=np.full((s, width), -1, np.int32),
        budget=np.ones(s, np.int32), logprobs=np.zeros(s, bool))
    for slot, seq in running.items():
      sampling = seq.request.sampling
      batch.tokens[slot], batch.lengths[slot] = seq.context[seq.length], seq.length
      batch.active[slot] = True
      batch.temperature[slot], batch.top_k[slot] = sampling.temperature, sampling.top_k
      batch.top_p[slot], batch.seeds[slot] = sampling.top_p, seq.seed
      batch.draining[slot] = seq.state == "draining"
      batch.stop_tokens[slot, :len(sampling.stop_tokens)] = sampling.stop_tokens
      batch.budget[slot] = max(sampling.max_tokens - len(seq.new_tokens), 1)
      batch.logprobs[slot] = sampling.logprobs
      batch.host_stops |= bool(sampling.stop_strings)
    return batch

  def _take(self, seq: _Sequence, tokens: np.ndarray, logprobs: np.ndarray) -> int:
    """Appends sampled tokens up to and including the first that stops the sequence
    (which then drains); returns how many were kept."""
    stop, reason = self._first_stop(seq, tokens)
    kept = len(tokens) if stop is None else stop + 1
    seq.context.extend(tokens[:kept].tolist())
    seq.new_tokens.extend(tokens[:kept].tolist())
    if seq.request.sampling.logprobs:
      seq.logprobs.extend(np.asarray(logprobs[:kept], np.float32).tolist())
    else:  # not asked for: NaN, whatever the backend computed
      seq.logprobs.extend([float("nan")] * kept)
    seq.versions.extend([self._version] * kept)
    if stop is not None:
      seq.finish_reason, seq.state = reason, "draining"
    return kept

  def _absorb(self, seq: _Sequence, out: SlotOutput) -> bool:
    """Records one call's fed tokens and new tokens; True when the sequence is done."""
    fed = len(out.fed_routing)
    if seq.state == "draining":  # this call fed the final token; what it sampled is void
      seq.routing.append(np.asarray(out.fed_routing[:1]))
      seq.length += 1
      return True
    kept = self._take(seq, np.asarray(out.new_tokens[:fed], np.int32), out.new_logprobs)
    # Token i was fed with routing fed_routing[i]; the kept tokens but the last are fed.
    seq.routing.append(np.asarray(out.fed_routing[:kept]))
    seq.length += kept
    if seq.state == "draining" and kept < fed:
      # The same call already fed the final token (a later step or accepted draft).
      seq.routing.append(np.asarray(out.fed_routing[kept:kept + 1]))
      seq.length += 1
      return True
    return False

  def _first_stop(self, seq: _Sequence, tokens: np.ndarray) -> tuple[int | None, str | None]:
    """(index of the first of `tokens`, appended in order, that stops `seq`, and why), or
    (None, None). Rules in order: stop token, stop string, max_tokens, length."""
    sampling = seq.request.sampling
    after_N = np.arange(1, len(tokens) + 1)
    # A few stop tokens: one comparison of each token with each (np.isin sorts).
    stop_token_N = (np.equal.outer(tokens, sampling.stop_tokens).any(axis=1)
                    if len(sampling.stop_tokens) else np.zeros(len(tokens), bool))
    max_tokens_N = len(seq.new_tokens) + after_N >= sampling.max_tokens
    length_N = len(seq.context) + after_N >= self.max_length
    hits_N = stop_token_N | max_tokens_N | length_N
    first = int(np.argmax(hits_N)) if hits_N.any() else None
    if sampling.stop_strings:
      window = 4 * max(len(s) for s in sampling.stop_strings) + 1
      history = seq.new_tokens[-window:]
      for i in range(len(tokens) if first is None else first + 1):
        if i == first and stop_token_N[i]:
          break
        text = self._detokenize((history + tokens[:i + 1].tolist())[-window:])
        if any(s in text for s in sampling.stop_strings):
          return i, "stop_string"
    if first is None:
      return None, None
    reason = ("stop_token" if stop_token_N[first] else
              "max_tokens" if max_tokens_N[first] else "length")
    return first, reason

  def _finish(self, seq: _Sequence) -> Generation:
    generation = Generation(
        seq_id=seq.seq_id, prompt_tokens=seq.prompt_tokens,
        tokens=np.asarray(seq.new_tokens, np.int32),
        logprobs=np.asarray(seq.logprobs, np.float32),
        versions=np.asarray(seq.versions, np.int32),
        expert_indices=np.concatenate(seq.routing).astype(np.int32),
        finish_reason=seq.finish_reason)
    if seq.request.keep_alive:
      seq.state = "idle"
    else:
      self._free.append(seq.slot)
      del self._seqs[seq.seq_id]
    return generation
