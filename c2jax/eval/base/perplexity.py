"""Codebase perplexity: NLL of a repository's token stream under a rolling window.

Windows (W = window, S = stride, N tokens x_0..x_{N-1}): window k covers positions
[k*S, min(k*S + W, N)) and is fed to the model on its own (positions 0..W-1). The first
window scores x_1..x_{W-1}; every later window scores only the positions past the end of
the previous one, i.e. its last S positions. So every token but x_0 is scored exactly once,
a token in the first window sees all tokens before it, and one in a later window sees
between W-S and W-1 tokens of left context (the standard sliding-window perplexity). With
W >= N there is one window and the result is the plain teacher-forced NLL.

Scoring is one jitted function of fixed shape [batch, W] (the last batch and the last,
short window are padded; padding sits after every scored token, so causal attention keeps
it out of their logits): it compiles once per (model, W, batch).

Shape legend: B windows per batch, W window length, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2jax import model
from c2jax.eval.base import codebase as codebase_lib


@dataclasses.dataclass(frozen=True)
class Window:
  begin: int  # first position fed
  score_from: int  # first position scored
  end: int  # one past the last position fed and scored


def plan_windows(num_tokens: int, window: int, stride: int) -> list[Window]:
  """The windows of the module docstring, in order."""
  if window < 2:
    raise ValueError(f"window = {window}; a window needs >= 2 tokens (context + target).")
  if not 1 <= stride < window:
    raise ValueError(f"stride = {stride} with window = {window}; use 1 <= stride < window "
                     "(a stride of W would score the first token of each window with no "
                     "context; W - stride is the minimum left context).")
  if num_tokens < 2:
    raise ValueError(f"{num_tokens} token(s): perplexity needs at least 2.")
  windows, begin, previous_end = [], 0, 0
  while True:
    end = min(begin + window, num_tokens)
    windows.append(Window(begin, max(previous_end, begin + 1), end))
    if end == num_tokens:
      return windows
    previous_end, begin = end, begin + stride


def _window_nll(cfg, params, tokens_BxW, scored_BxW):
  """-log p(x_j | x_<j) at every scored position j >= 1 of each row; 0 elsewhere."""
  logits_BxWxV = model.forward(cfg, params, tokens_BxW)
  logits_BxWxV = logits_BxWxV[:, :-1]
  targets_BxW = tokens_BxW[:, 1:]
  picked = jnp.take_along_axis(logits_BxWxV, targets_BxW[..., None], axis=-1)[..., 0]
  nll = jax.nn.logsumexp(logits_BxWxV, axis=-1) - picked
  nll_BxW = jnp.pad(nll, ((0, 0), (1, 0)))
  return jnp.where(scored_BxW, nll_BxW, 0.0)


class WindowScorer:
  """The jitted scorer for one (model config, window, batch): build once, call often.

  mesh: score data-parallel over a device mesh: windows are split across all its devices
  (batch_size must be a multiple of its size) and the parameters replicated on each,
  e.g. `Mesh(np.asarray(jax.devices()), ("data",))` for every local device. None runs on
  the default device.
  """

  def __init__(self, cfg, params, *, window: int, batch_size: int = 8,
               mesh: jax.sharding.Mesh | None = None):
    if batch_size < 1:
      raise ValueError(f"batch_size = {batch_size}; use >= 1 windows per batch.")
    if window > cfg.max_position:
      raise ValueError(f"window = {window} exceeds the model's max_position "
                       f"{cfg.max_position}; use a shorter window.")
    self.cfg, self.window, self.batch_size = cfg, window, batch_size
    fn = functools.partial(_window_nll, cfg)
    if mesh is None:
      self.params = jax.device_put(params)
      self._fn = jax.jit(fn)
      return
    if batch_size % mesh.size:
      raise ValueError(f"batch_size = {batch_size} windows cannot be split over the "
                       f"{mesh.size} devices of the mesh; use a multiple of {mesh.size}.")
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(mesh.axis_names))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    self.params = jax.device_put(params, replicated)
    self._fn = jax.jit(fn, in_shardings=(replicated, rows, rows), out_shardings=rows)

  def __call__(self, tokens_BxW: np.ndarray, scored_BxW: np.ndarray) -> np.ndarray:
    return np.asarray(self._fn(self.params, tokens_BxW, scored_BxW), np.float64)

  def token_nll(self, ids: np.ndarray, stride: int) -> tuple[np.ndarray, int]:
    """(nll [N] float64 with nll[p] = -log p(x_p | window context), 0 at p = 0; number of
    windows)."""
    ids = np.asarray(ids, np.int32)
    if ids.ndim != 1:
      raise ValueError(f"ids has shape {ids.shape}; pass one token stream [N].")
    if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
      raise ValueError(f"token ids span [{ids.min()}, {ids.max()}] but the model's "
                       f"vocab_size is {self.cfg.vocab_size}; use the run's own tokenizer.")
    windows = plan_windows(len(ids), self.window, stride)
    nll = np.zeros(len(ids), np.float64)
    width, rows = self.window, self.batch_size

    def absorb(group, values):
      values = np.asarray(values, np.float64)
      for r, w in enumerate(group):
        nll[w.score_from:w.end] = values[r, w.score_from - w.begin:w.end - w.begin]

    pending = None
    for first in range(0, len(windows), rows):
      group = windows[first:first + rows]
      tokens = np.zeros((rows, width), np.int32)
      scored = np.zeros((rows, width), bool)
      for r, w in enumerate(group):
        tokens[r, :w.end - w.begin] = ids[w.begin:w.end]
        scored[r, w.score_from - w.begin:w.end - w.begin] = True
      # Read each batch one step late so the device is never idle while the host packs.
      launched = (group, self._fn(self.params, tokens, scored))
      if pending is not None:
        absorb(*pending)
      pending = launched
    absorb(*pending)
    return nll, len(windows)


@dataclasses.dataclass(frozen=True)
class FileNLL:
  path: str
  tokens: int  # scored tokens of this file
  bytes: int  # UTF-8 bytes of its document (header included)
  nll: float  # nats


@dataclasses.dataclass(frozen=True)
class PerplexityResult:
  """Sums in nats. perplexity = exp(nll / tokens); bits_per_byte = nll / ln 2 / bytes,
  which compares across tokenizers."""
  nll: float
  tokens: int
  bytes: int
  window: int
  stride: int
  windows: int
  files: tuple[FileNLL, ...]
  skipped: dict[str, int]
  seconds: float

  @property
  def nll_per_token(self) -> float:
    return self.nll / self.tokens

  @property
  def perplexity(self) -> float:
    return math.exp(min(self.nll_per_token, 700.0))

  @property
  def bits_per_byte(self) -> float:
    return self.nll / math.log(2) / self.bytes

  @property
  def tokens_per_second(self) -> float:
    return self.tokens / self.seconds if self.seconds > 0 else float("inf")

  def summary(self) -> dict:
    """The scalar metrics (what a results table shows)."""
    return {"nll": self.nll, "tokens": self.tokens, "bytes": self.bytes,
            "nll_per_token": self.nll_per_token, "perplexity": self.perplexity,
            "bits_per_byte": self.bits_per_byte, "window": self.window,
            "stride": self.stride, "windows": self.windows, "files": len(self.files),
            "seconds": self.seconds, "tokens_per_second": self.tokens_per_second}

  def to_json(self) -> dict:
    return {**self.summary(), "skipped": dict(self.skipped),
            "per_file": [dataclasses.asdict(f) for f in self.files]}


def score_stream(scorer: WindowScorer, stream: codebase_lib.CodebaseTokens, stride: int,
                 skipped: dict[str, int] | None = None) -> PerplexityResult:
  """Scores a tokenised codebase; per-file sums follow each token's file."""
  began = time.perf_counter()
  nll, num_windows = scorer.token_nll(stream.ids, stride)
  seconds = time.perf_counter() - began
  owner = stream.file_index()
  # Position 0 is never scored: without BOS it is the first file's first token.
  owner_scored = owner[1:]
  nll_scored = nll[1:]
  keep = owner_scored >= 0
  per_file_nll = np.bincount(owner_scored[keep], nll_scored[keep], minlength=len(stream.paths))
  per_file_tokens = np.bincount(owner_scored[keep], minlength=len(stream.paths))
  files = tuple(FileNLL(path, int(t), int(b), float(n)) for path, t, b, n in zip(
      stream.paths, per_file_tokens, stream.num_bytes, per_file_nll))
  return PerplexityResult(
      nll=float(nll_scored.sum()), tokens=len(stream.ids) - 1,
      bytes=int(stream.num_bytes.sum()), window=scorer.window, stride=stride,
      windows=num_windows, files=files, skipped=dict(skipped or {}), seconds=seconds)


def codebase_perplexity(cfg, params, tokenizer, root: str | os.PathLike, *, window: int,
                        stride: int, batch_size: int = 8, mesh: jax.sharding.Mesh | None = None,
                        options: codebase_lib.CodebaseOptions = codebase_lib.CodebaseOptions(),
                        scorer: WindowScorer | None = None) -> PerplexityResult:
  """Codebase perplexity of the repository at `root` (report App. B).

  cfg / params: the model (c2jax.model); tokenizer: the run's (c2jax.data.Tokenizer).
  mesh: data-parallel scoring over its devices (see WindowScorer). Pass a `scorer` built
  for (cfg, params, window) to reuse its compiled function across repositories.
  """
  if scorer is None:
    scorer = WindowScorer(cfg, params, window=window, batch_size=batch_size, mesh=mesh)
  elif scorer.window != window:
    raise ValueError(f"the scorer was built for window {scorer.window}, not {window}.")
  found = codebase_lib.collect(root, options)
  stream = codebase_lib.tokenize(found, tokenizer, options)
  return score_stream(scorer, stream, stride, found.skipped)
