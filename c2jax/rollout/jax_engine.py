"""JaxEngine: the c2jax model behind the Engine interface, over a preallocated KV cache.

Compiled functions have static shapes, so a run compiles a handful of programs:
  prefill  one slot, a chunk of `bucket` tokens (prompt lengths are padded up to the next
           bucket; longer inputs are split into chunks of the largest bucket), writing that
           slot's rows of the cache and sampling the next token: one compile per bucket;
           requests admitted together that fit one chunk each are prefilled several to a
           call (prefill.py's prefill_rows: up to `max_prefill_tokens` padded tokens a
           call, rows padded to a power of two), one compile per (bucket, rows) used;
           a chunk attends with the engine's own choice of kernel (prefill_attention,
           default 'auto': blockwise tiles once the chunk or the cache exceeds a tile, 128
           on CPU; prefill.prefill_config), not the training forwards' attention_impl;
  decode   up to `max_decode_steps` tokens for every slot at once, sampling and stop
           checks on device (decode_loop.py): one compile per stop-token width (padded
           to a power of two). The device loop returns as soon as a slot finishes (stop
           token, max_tokens, length), so a longer call costs no finished request any
           wait; only while a running request has stop strings, which the host alone
           sees, does a call stop after `decode_steps` tokens. Idle and empty slots are
           fed at position max_length, where cache writes are dropped, so they cost
           compute but never corrupt a kept sequence. Staged weights are swapped in
           between these calls, so a swap waits at most `max_decode_steps` tokens.
With `num_draft_tokens > 0` the decode step is speculative (see speculative.py): the
model's MTP module drafts tokens that one forward over all slots verifies.
With a `parallel` config the engine spans a mesh of this process's devices, or under
jax.distributed of every process's, process 0 scheduling and the others following it
program by program (sharding.py, lockstep.py):
parameters and caches are placed by the training logical rules, and every program keeps
the state's shardings from step to step (and across weight swaps).
How the engine keeps its weights and cache is one strategy it picks per platform
(decode_layout.choose): on one CPU device, with enough slots, cpu_decode's per-layer
layout (one array per layer and routed expert or fused small experts, a per-layer KV
cache, projection kernels in the form measured fastest on this machine; `projection_forms`
says which), since XLA:CPU copies a weight it slices out of a stacked array per step;
accelerators (whose compilers read such slices in place and whose grouped matmuls want
stacked experts) and meshes keep model.init's stacked tree. Either way `update_params`
and `param_like` take and give the stacked tree.

Shape legend: S slots, C chunk length, T max_length, V vocab, Lm MoE layers, K experts
per token, D draft tokens per step.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from c2jax import model
from c2jax.rollout import decode_layout, decode_loop, lockstep
from c2jax.rollout import prefill as prefill_lib
from c2jax.rollout import resident
from c2jax.rollout import sampling as sampling_lib
from c2jax.rollout import sharding as sharding_lib
from c2jax.rollout import speculative
from c2jax.rollout.engine import DecodeBatch, Engine, SlotOutput
from c2jax.rollout.types import SamplingParams

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512)
DEFAULT_DECODE_STEPS = 8
# Tokens a decode call may run when no request has stop strings: one host round trip
# per 64 tokens, as a whole-generation device loop nearly (the host's per-call work,
# scheduling and reading the tokens, log-probs and routing back, cost 10-25% of a tiny
# model's decode at 8; docs/benchmarks.md, "Decode against the JAX peers"); also the
# bound on how long a staged weight swap waits.
DEFAULT_MAX_DECODE_STEPS = 64
# Padded tokens one batched prefill call may hold (requests admitted together, e.g. an RL
# group's samples or concurrent server requests): 32 prompts of 64 tokens in one call.
DEFAULT_MAX_PREFILL_TOKENS = 2048
# Seconds a program (or weight swap) of an engine over several processes may take, its
# first compiling call aside, before its watchdog names the process holding it up and
# the process exits (lockstep.Watchdog).
DEFAULT_HANG_TIMEOUT_S = 600.0


def _top(cfg, k, params, tokens_1xC, temperature):
  """The k most likely next tokens after every position, under the temperature-scaled
  distribution the sampler reports log-probs in: (ids [C, k], log-probs [C, k])."""
  logits_CxV = model.forward(cfg, params, tokens_1xC)[0]
  logp_CxV = sampling_lib.policy_logprobs(logits_CxV, jnp.broadcast_to(
      temperature, logits_CxV.shape[:1]))
  values_Cxk, ids_Cxk = jax.lax.top_k(logp_CxV, k)
  return ids_Cxk, values_Cxk


def _decode_steps(decode_steps: int | None, max_decode_steps: int | None,
                  num_draft: int) -> tuple[int, int]:
  """(decode_steps, max_decode_steps) with their defaults (JaxEngine), checked."""
  if decode_steps is None:
    decode_steps = 1 if num_draft else DEFAULT_DECODE_STEPS
  if max_decode_steps is None:
    max_decode_steps = 1 if num_draft else max(DEFAULT_MAX_DECODE_STEPS, decode_steps)
  if decode_steps < 1 or max_decode_steps < decode_steps or (num_draft
                                                             and max_decode_steps != 1):
    raise ValueError(f"decode_steps = {decode_steps}, max_decode_steps = "
                     f"{max_decode_steps} with num_draft_tokens = {num_draft}: use "
                     "1 <= decode_steps <= max_decode_steps, and 1 (or None) for both "
                     "when speculating (a speculative call runs one verify step).")
  return decode_steps, max_decode_steps


def _host(x) -> np.ndarray:
  """A program output on the host; a replicated array over several processes' devices
  is read from this process's copy."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(x.addressable_data(0))
  return np.asarray(x)


def _score(cfg, params, tokens_1xC):
  logp_1xCxV = jax.nn.log_softmax(model.forward(cfg, params, tokens_1xC), axis=-1)
  return jnp.take_along_axis(logp_1xCxV[0, :-1], tokens_1xC[0, 1:, None], axis=-1)[:, 0]


class JaxEngine(Engine):
  """The model-backed engine. `params` is the tree of `c2jax.model.init` (plus
  'mtp_layers' when speculating); `version` tags tokens sampled with these weights.
  `parallel`: a parallel config section (mesh + rules; sharding.engine_parallel_defaults)
  to shard over local devices; None, or a mesh of one device, runs on one device.
  `decode_steps`: tokens per slot one decode call may produce while a running request
  has stop strings (the host syncs once per call, and checks them); default
  DEFAULT_DECODE_STEPS, or 1 with speculation (one speculative step per call, the only
  mode it has). `max_decode_steps`: the same otherwise (default the larger of
  DEFAULT_MAX_DECODE_STEPS and decode_steps; 1 with speculation); it bounds how many
  tokens a staged weight swap waits. `max_prefill_tokens`: the most (padded) tokens one
  call prefills when requests are admitted together (default DEFAULT_MAX_PREFILL_TOKENS,
  at least the largest bucket); it bounds a prefill call's activations.
  `prefill_attention`, `prefill_block`: the attention kernel and tile of the engine's
  forwards over many tokens (prefill chunks, `logprobs`, `top_logprobs`), whatever
  model.attention_impl says for training (prefill.prefill_config): by default 'auto'
  (blockwise in 128-token tiles on CPU once a chunk or the cache exceeds a tile, cuDNN on
  a GPU where it takes the shape); None keeps the config's.
  `weights_quant`: 'none' (default) keeps the weights in the tree's dtypes; 'fp8'
  (128 x 128 block scales), 'int8' or 'int4' (groups along the inputs) holds the routed
  experts quantised (c2jax.rollout.resident.quantize_resident; every swap quantises the
  new weights again, so the sampler holds exactly quantise(published weights)), and their
  grouped matmuls dequantise a tile at a time (kernels.weight_quant). The engine then keeps
  the stacked layout on every platform. `resident_weights()` reports what it holds.
  Experts already held in `params` (WeightQuant leaves of that scheme: a released
  checkpoint read as stored by c2jax.hf.load(weights_quant=)) are kept bit for bit; swaps
  take full-precision weights as usual.
  `hang_timeout_s`: over several processes, the seconds a program or weight swap may take
  (first compiling calls aside) before the watchdog names the process holding it up and
  calls `on_hang` (default: print that, exit 1; lockstep.Watchdog)."""

  def __init__(self, cfg, params, *, num_slots: int, max_length: int, version: int = 0,
               prefill_buckets: Sequence[int] = DEFAULT_BUCKETS, num_draft_tokens: int = 0,
               detokenize: Callable[[Sequence[int]], str] | None = None, seed: int = 0,
               parallel=None, decode_steps: int | None = None,
               max_decode_steps: int | None = None, max_prefill_tokens: int | None = None,
               prefill_attention: str | None = "auto", prefill_block: int | None = None,
               weights_quant: str = "none", hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S):
    super().__init__(num_slots, max_length, detokenize, seed)
    self.weights_quant = resident.check_weights_quant(weights_quant)
    self.decode_steps, self.max_decode_steps = _decode_steps(decode_steps, max_decode_steps,
                                                             num_draft_tokens)
    self.cfg, self._version, self._num_draft = cfg, version, num_draft_tokens
    self._long_cfg = prefill_lib.prefill_config(cfg, prefill_attention, prefill_block)
    self._buckets = tuple(sorted(prefill_buckets))
    self.max_prefill_tokens = max(self._buckets[-1], DEFAULT_MAX_PREFILL_TOKENS
                                  if max_prefill_tokens is None else max_prefill_tokens)
    self.placement = sharding_lib.placement_from_config(parallel, num_slots)
    # A mesh over several processes' devices: process 0 schedules and publishes each
    # program's inputs, the others follow (lockstep.py, `follow`).
    self._lockstep = (lockstep.Lockstep(hang_timeout_s=hang_timeout_s)
                      if self.placement is not None
                      and lockstep.spans_processes(self.placement.mesh) else None)
    self._broken = False  # a program failed over several processes
    if num_draft_tokens:
      speculative.check_drafter(cfg, params, num_draft_tokens)
    # Quantised experts run the sorted dispatch on the stacked tree (CPU decode's
    # per-layer layout splits and fuses unquantised ones).
    self._layout = decode_layout.StackedLayout() if weights_quant != "none" else (
        decode_layout.choose(cfg, params, num_slots=num_slots, num_draft=num_draft_tokens,
                             placement=self.placement))
    # {(inputs, outputs): form} of the projection kernels stored another way ({} if none).
    self.projection_forms = self._layout.forms
    with self._scope():
      state_shardings = self._build_state(params)
    self._build_programs(state_shardings)
    self.acceptance = speculative.AcceptanceStats()

  def _build_state(self, params) -> list:
    """Places the parameters and zeroes the caches (the MTP cache and the last hidden
    state too when speculating), born sharded on a mesh; returns the state's shardings
    (Nones off a mesh), as the programs take the state after the parameters."""
    cfg, placement = self.cfg, self.placement
    slots, length = self.num_slots, self.max_length
    self._param_shardings = placement and placement.param_shardings(cfg, params)
    self._params = self._place(params)
    shardings = [placement and placement.cache_shardings(cfg)]
    self._cache = self._zeros(functools.partial(self._layout.make_cache, cfg, slots, length),
                              shardings[0])
    if self._num_draft:
      shardings += [placement and placement.mtp_cache_shardings(cfg),
                    placement and placement.hidden_sharding()]
      self._mtp_cache = self._zeros(functools.partial(
          speculative.init_mtp_cache, cfg, slots, length), shardings[1])
      self._last_hidden = self._zeros(functools.partial(
          jnp.zeros, (slots, cfg.hidden_size), jnp.dtype(cfg.dtype)), shardings[2])
    return shardings

  def _build_programs(self, state_shardings) -> None:
    """The jitted programs: scoring and prefill over the long-input config; decode plain
    (decode_loop, up to max_decode_steps tokens a call) or speculative (one verify step)."""
    cfg, long_cfg = self.cfg, self._long_cfg
    self._score = self._jit(functools.partial(_score, long_cfg))
    self._top_fns = {}  # k -> jitted _top
    if self._num_draft:
      self._prefill_fn = self._jit(functools.partial(speculative.prefill, long_cfg),
                                   state_shardings, extra_outputs=3)
      self._decode_fn = self._jit(
          functools.partial(speculative.decode, cfg, num_draft=self._num_draft),
          state_shardings, extra_outputs=4)
      return
    self._prefill_fn = self._jit(functools.partial(prefill_lib.prefill_chunk, long_cfg),
                                 state_shardings, extra_outputs=3)
    self._prefill_rows_fn = self._jit(functools.partial(prefill_lib.prefill_rows, long_cfg),
                                      state_shardings, extra_outputs=3)
    self._decode_fn = self._jit(
        functools.partial(decode_loop.decode_steps, cfg, self.max_decode_steps),
        state_shardings, extra_outputs=4)

  # ---- placement ------------------------------------------------------------------------
  def _scope(self):
    return self.placement.scope() if self.placement else contextlib.nullcontext()

  def _place(self, params):
    """Parameters on the engine's devices, laid out by the rules (host or device arrays,
    whatever their current sharding), in the engine's layout; records the stacked tree's
    shapes, dtypes and shardings (param_like)."""
    if self.placement is None:
      stacked = jax.device_put(params)
    else:
      stacked = jax.device_put(params, self._param_shardings)
    # New versions arrive at full precision, experts held as stored (hf.load) included.
    self._stacked_like = resident.plain_like(stacked)
    held = resident.quantize_resident(stacked, self.weights_quant)
    del stacked  # the unquantised experts go once quantised
    self._held_like = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), held)
    return self._layout.to_layout(held)

  def _zeros(self, make, shardings):
    """Zero state born sharded (never whole on one device)."""
    return make() if shardings is None else jax.jit(make, out_shardings=shardings)()

  def _jit(self, fn, state_shardings=(), extra_outputs: int = 0):
    """jit donating the leading state arguments (after params). On a mesh, the state
    leaves with its shardings (so every step sees the same layout), other outputs are
    replicated (the host reads them), and every call traces and runs in the scope."""
    donate = tuple(range(1, 1 + len(state_shardings)))
    if self.placement is None:
      return jax.jit(fn, donate_argnums=donate)
    out = (*state_shardings, *([self.placement.replicated] * extra_outputs))
    compiled = jax.jit(fn, donate_argnums=donate,
                       out_shardings=out if state_shardings else self.placement.replicated)

    def call(*args):
      with self._scope():
        return compiled(*args)
    return call

  def _set_params(self, params) -> None:
    old = jax.tree.map(lambda x: (x.shape, x.dtype), self._stacked_like)
    # result_type reads the dtype without copying host arrays onto a device.
    new = jax.tree.map(lambda x: (np.shape(x), jnp.result_type(x)), params)
    if jax.tree.structure(old) != jax.tree.structure(new) or old != new:
      raise ValueError("update_params got a parameter tree whose structure, shapes or "
                       "dtypes differ from the engine's; in-flight weight swaps need the "
                       "same model config (build a new engine for a new architecture).")
    self._params = self._place(params)

  def resident_weights(self) -> dict[str, dict]:
    """The weights this engine holds, by tensor group: bytes (total and per device of its
    mesh) and dtypes (c2jax.rollout.resident): quantised experts as held, values and
    scales."""
    return resident.weight_groups(self._held_like)

  def param_like(self):
    """ShapeDtypeStructs of the engine's parameters, with their shardings: a template
    for weight loaders (c2jax.rollout.weights `like=`) so new versions arrive already laid
    out as the engine places them (model.init's stacked tree). Over several processes the
    template has no shardings: placing an array on several processes' devices is a
    collective, which they run together when the leader's swap is installed."""
    if self._lockstep is not None:
      return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self._stacked_like)
    return self._stacked_like

  # ---- one program call, and the processes that follow it ----------------------------
  @property
  def is_leader(self) -> bool:
    """Whether this process schedules the engine: False only on the processes other than
    0 of an engine over several processes (process 0 schedules; the others `follow`)."""
    return self._lockstep is None or self._lockstep.leader

  def _state(self) -> tuple:
    if self._num_draft:
      return self._cache, self._mtp_cache, self._last_hidden
    return (self._cache,)

  def _program(self, name: str):
    if name.startswith("top:"):
      k = int(name[4:])
      if k not in self._top_fns:
        self._top_fns[k] = self._jit(functools.partial(_top, self._long_cfg, k))
      return self._top_fns[k], False
    return {"prefill": (self._prefill_fn, True), "decode": (self._decode_fn, True),
            "prefill_rows": (getattr(self, "_prefill_rows_fn", None), True),
            "score": (self._score, False)}[name]

  def _call(self, name: str, *args) -> tuple[np.ndarray, ...]:
    """Runs program `name` on the weights (and the state it updates) and host `args`;
    returns its other outputs as host arrays. The leader of an engine over several
    processes first publishes (name, args) for its followers to run the same."""
    if self._lockstep is not None and self._lockstep.leader:
      self._lockstep.send(name, *args)
    program, stateful = self._program(name)
    state = self._state() if stateful else ()
    watched = (self._lockstep.running(f"program '{name}'", (name, *map(np.shape, args)))
               if self._lockstep is not None else contextlib.nullcontext())
    with watched:
      try:
        out = program(self._params, *state, *args)
        out = out if isinstance(out, tuple) else (out,)
        result = tuple(_host(x) for x in out[len(state):])
      except Exception:
        self._broken = self._lockstep is not None  # a process may be gone: never wait for it
        raise
    if stateful:
      if self._num_draft:
        self._cache, self._mtp_cache, self._last_hidden = out[:3]
      else:
        self._cache = out[0]
    if self._lockstep is not None and self._lockstep.leader:
      self._lockstep.synced()
    return result

  @property
  def on_hang(self):
    """What the hang watchdog of an engine over several processes calls with a
    lockstep.EngineHang (settable; default lockstep.exit_on_hang); None otherwise."""
    watchdog = self._lockstep.watchdog if self._lockstep is not None else None
    return watchdog.on_hang if watchdog is not None else None

  @on_hang.setter
  def on_hang(self, fn) -> None:
    if self._lockstep is None or self._lockstep.watchdog is None:
      raise RuntimeError("on_hang: this engine runs in one process; it has no watchdog.")
    self._lockstep.watchdog.on_hang = fn

  def step(self):
    """As Engine.step; on the leader of an engine over several processes a staged swap is
    announced (by version) before it is installed, so the followers install the same
    version at the same point between programs."""
    if self._lockstep is not None and self._lockstep.leader:
      with self._lock:
        staged, self._staged = self._staged, None
      if staged is not None:
        self._lockstep.send("swap", staged[1])
        with self._lockstep.running(f"installing weights version {staged[1]}", "install"):
          self._set_params(staged[0])
        self._version = staged[1]
    return super().step()

  def follow(self, load_params: Callable[[int], object] | None = None) -> None:
    """A follower's loop (processes other than 0 of an engine over several processes):
    runs every program the leader runs, in its order, until the leader's
    `stop_followers`. `load_params(version)` returns the weights of a version the leader
    swaps in (each process loads its own copy, e.g. from the RL weight directory).
    Raises lockstep.LeaderGone when the leader's process is gone."""
    if self.is_leader:
      raise RuntimeError("follow() runs on the processes other than 0 of an engine over "
                         "several processes; this process leads (it schedules).")
    while True:
      op, args = self._lockstep.receive()
      if op == "stop":
        self._lockstep.stopped()
        return
      if op == "swap":
        if load_params is None:
          raise RuntimeError(f"the leader swapped in weights version {args[0]}; give "
                             "follow() a load_params(version) to load them here.")
        with self._lockstep.running(f"loading weights version {args[0]}", collective=False):
          params = load_params(args[0])
        with self._lockstep.running(f"installing weights version {args[0]}", "install"):
          self._set_params(params)
        self._version = args[0]
        continue
      self._call(op, *args)

  def stop_followers(self) -> None:
    """Leader: ends the followers' `follow` loops (no program runs after it); returns
    once every follower has left its loop, or at once after a failed program (a follower
    may be gone)."""
    if self._lockstep is not None and self._lockstep.leader:
      if self._broken:
        self._lockstep.send("stop")
      else:
        self._lockstep.stop()

  def _bucket(self, count: int) -> int:
    return next((b for b in self._buckets if b >= count), self._buckets[-1])

  def _append(self, slot, context, start, sampling: SamplingParams, seed):
    # Speculative prefill re-feeds the previous token so its MTP cache entry, which needs
    # the first new token, is rewritten (see speculative.prefill).
    overlap = 1 if (self._num_draft and start > 0) else 0
    position, routing = start - overlap, []
    settings = (np.float32(sampling.temperature), np.int32(sampling.top_k),
                np.float32(sampling.top_p), np.uint32(seed))
    while position < len(context):
      count = min(self._buckets[-1], len(context) - position)
      chunk = np.zeros((1, self._bucket(count)), np.int32)
      chunk[0, :count] = context[position:position + count]
      following = context[position + count] if position + count < len(context) else -1
      extra = (np.int32(following),) if self._num_draft else ()
      token, logprob, chunk_routing = self._call(
          "prefill", np.int32(slot), chunk, np.int32(position), np.int32(count), *extra,
          *settings)
      skip = overlap if position == start - overlap else 0
      routing.append(chunk_routing[:, skip:count].transpose(1, 0, 2))
      position += count
    return int(token), float(logprob), np.concatenate(routing)

  def _append_many(self, items):
    """Prefills requests that fit one chunk several to a call, longest first (so a call's
    rows share a bucket width): up to max_prefill_tokens (padded) tokens a call, the rows
    padded to a power of two (a few compiled shapes). Others, a lone one, and every
    request with speculation go one at a time (_append)."""
    results = [None] * len(items)
    new_tokens = [len(context) - start for _, context, start, _, _ in items]
    together = sorted((i for i, n in enumerate(new_tokens)
                       if not self._num_draft and n <= self._buckets[-1]),
                      key=lambda i: -new_tokens[i])
    while len(together) > 1:
      width = self._bucket(new_tokens[together[0]])
      rows = 1 << (max(self.max_prefill_tokens // width, 1).bit_length() - 1)
      group, together = together[:rows], together[rows:]
      if len(group) > 1:
        for i, out in zip(group, self._prefill_group([items[i] for i in group], width)):
          results[i] = out
    for i, item in enumerate(items):
      if results[i] is None:
        results[i] = self._append(*item)
    return results

  def _prefill_group(self, items, width: int):
    rows = 1 << (len(items) - 1).bit_length()
    slots = np.full(rows, self.num_slots, np.int32)  # padding rows: out of range
    tokens = np.zeros((rows, width), np.int32)
    starts, counts = np.zeros(rows, np.int32), np.ones(rows, np.int32)
    temperature, top_p = np.ones(rows, np.float32), np.ones(rows, np.float32)
    top_k, seeds = np.zeros(rows, np.int32), np.zeros(rows, np.uint32)
    for r, (slot, context, start, sampling, seed) in enumerate(items):
      count = len(context) - start
      slots[r], starts[r], counts[r] = slot, start, count
      tokens[r, :count] = context[start:]
      temperature[r], top_k[r], top_p[r] = sampling.temperature, sampling.top_k, sampling.top_p
      seeds[r] = seed
    tokens_P, logprobs_P, routing_LmxPxCxK = self._call(
        "prefill_rows", slots, tokens, starts, counts, temperature, top_k, top_p, seeds)
    routing = routing_LmxPxCxK.transpose(1, 2, 0, 3)  # [P, C, Lm, K]
    return [(int(tokens_P[r]), float(logprobs_P[r]), routing[r, :counts[r]])
            for r in range(len(items))]

  def _decode(self, batch: DecodeBatch) -> dict[int, SlotOutput]:
    arrays = (batch.tokens, batch.lengths, batch.active, batch.temperature, batch.top_k,
              batch.top_p, batch.seeds)
    if self._num_draft:
      new, logprobs, counts, routing_LmxSxGxK = self._call("decode", *arrays)
      routing = routing_LmxSxGxK.transpose(1, 2, 0, 3)
      active = np.flatnonzero(batch.active)
      self.acceptance.record(counts[active] - 1)
      return {s: SlotOutput(new[s, :counts[s]], logprobs[s, :counts[s]],
                            routing[s, :counts[s]]) for s in active}
    new, logprobs, fed, routing_LmxSxNxK = self._call(
        "decode", *arrays[:3], batch.draining, *arrays[3:], batch.stop_tokens, batch.budget,
        np.int32(self.decode_steps if batch.host_stops else self.max_decode_steps),
        batch.logprobs)
    routing = routing_LmxSxNxK.transpose(1, 2, 0, 3)
    return {s: SlotOutput(new[s, :fed[s]], logprobs[s, :fed[s]], routing[s, :fed[s]])
            for s in np.flatnonzero(batch.active)}

  def top_logprobs(self, tokens: Sequence[int], k: int,
                   temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced alternatives: for each position t of `tokens`, the k most likely
    next tokens and their log-probs at `temperature` ((ids, log-probs), each [len, k]).
    What an OpenAI `top_logprobs` reply shows next to each sampled token."""
    if not 1 <= k <= self.cfg.vocab_size:
      raise ValueError(f"top_logprobs k = {k}; use 1..{self.cfg.vocab_size}.")
    tokens = np.asarray(tokens, np.int32)
    largest = self._buckets[-1]
    length = (self._bucket(len(tokens)) if len(tokens) <= largest
              else -(-len(tokens) // largest) * largest)
    padded = np.zeros((1, length), np.int32)
    padded[0, :len(tokens)] = tokens
    ids, values = self._call(f"top:{k}", padded, np.float32(temperature))
    return ids[:len(tokens)], values[:len(tokens)]

  def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
    results, largest = [], self._buckets[-1]
    for tokens in sequences:
      tokens = np.asarray(tokens, np.int32)
      # Beyond the largest bucket, pad to a multiple of it (one compile per multiple).
      length = (self._bucket(len(tokens)) if len(tokens) <= largest
                else -(-len(tokens) // largest) * largest)
      padded = np.zeros((1, length), np.int32)
      padded[0, :len(tokens)] = tokens
      results.append(self._call("score", padded)[0][:len(tokens) - 1])
    return results
