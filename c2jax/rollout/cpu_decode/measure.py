"""How the CPU decode layout stores its projection kernels (forms.py), by the rows a step
multiplies and whether the weights stream from memory: measured, per machine.

XLA:CPU's products with a few rows run below the memory's bandwidth on many shapes, and
which form of the same weight runs fastest (as stored, transposed with the output axes
first, as column pieces, or in 32-column panels multiplied by c2jax_kernels.cpu_matmul's
kernel where it builds) depends on the rows, the shape and the machine: on one 2-core
AMD EPYC VM (2026-12-01, AVX2 kernels) transposed projections and a 256-column-piece LM
head made the whole `qwen3_small` decode step 1.16-1.26x faster at batch 8 and 32; on
another (2026-12-03, Zen 4 with AVX-512, same jax 0.12.0.1) the same layout made it
0.82-0.84x (docs/benchmarks.md, "Decode against the JAX peers"). So the form is measured,
not assumed: projection_layout times every candidate form of each distinct kernel shape
at the engine's rows, as Linear runs it, with the kernel read from memory as a decode
step's weights are (measure_forms), and keeps the fastest. The timings are
kept per machine (CPU, cores, jax and jaxlib, XLA_FLAGS) in a JSON file, so an engine
measures a shape once: C2JAX_CPU_LAYOUT_CACHE=PATH (default
~/.cache/c2jax/cpu_layout.json), or `off` to measure in every process.

When the weights fit in the last-level cache (`qwen3_tiny`, 4.6 MB) nothing is measured
and the kernels stay as model.init stores them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2jax_kernels import cpu_matmul

from c2jax import model
from c2jax.model import layers
from c2jax.rollout.cpu_decode.forms import PANELS, TRANSPOSED, store

# Column pieces of this width are a candidate form for kernels of at least 4 of them.
HEAD_PIECE_COLUMNS = 256
# Another form replaces the kernel as stored only when it is faster by more than this.
MIN_GAIN = 0.03
# A measurement times a chain of copies of the kernel (about CHAIN_BYTES of them, within
# these bounds, so one call's overhead does not count), after reading twice the last-level
# cache's worth of other memory, so every copy is read from memory as in a decode step;
# ROUNDS rounds interleaved across the forms, the best counting. Kernels of more than
# MAX_MEASURED_BYTES stay as stored (their copies would take gigabytes).
CHAIN_BYTES, MIN_COPIES, MAX_COPIES, ROUNDS = 16 << 20, 2, 32, 7
MAX_MEASURED_BYTES = 64 << 20
CACHE_ENV, DEFAULT_CACHE = "C2JAX_CPU_LAYOUT_CACHE", "~/.cache/c2jax/cpu_layout.json"
_log = logging.getLogger(__name__)

# Used when the machine does not say its last-level cache size (the VMs above: 32 MB).
DEFAULT_LAST_LEVEL_CACHE = 32 << 20


def last_level_cache_bytes() -> int:
  """The CPU's largest cache (Linux sysfs), else DEFAULT_LAST_LEVEL_CACHE."""
  root = "/sys/devices/system/cpu/cpu0/cache"
  sizes = []
  try:
    for index in os.listdir(root):
      with open(os.path.join(root, index, "size")) as f:
        text = f.read().strip()
      scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
      sizes.append(int(text.rstrip("KMG")) * scale)
  except (OSError, ValueError):
    return DEFAULT_LAST_LEVEL_CACHE
  return max(sizes, default=DEFAULT_LAST_LEVEL_CACHE)


def candidate_forms(outputs: int, panels: bool = False) -> tuple:
  """The forms projection_layout measures for a kernel producing `outputs` values: as
  stored (1), TRANSPOSED, HEAD_PIECE_COLUMNS-wide column pieces when there are 4 or more of
  them, and with `panels` (float32, the last output axis a multiple of 32, and
  c2jax_kernels.cpu_matmul built here) PANELS."""
  pieces = outputs // HEAD_PIECE_COLUMNS
  return ((1, TRANSPOSED) + ((pieces,) if pieces >= 4 else ())
          + ((PANELS,) if panels else ()))


@functools.cache
def machine_key() -> str:
  """What a measurement holds for: the CPU (cpu_matmul.cpu_identity: vendor, family, model,
  stepping, name, flags), the cores this process may use, jax and jaxlib, and XLA_FLAGS
  (which JAX reads once per process)."""
  import jaxlib  # pylint: disable=import-outside-toplevel
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  cpu = hashlib.sha256(cpu_matmul.cpu_identity().encode()).hexdigest()[:12]
  return " | ".join([f"cpu {cpu}", f"{cores} cores", f"jax {jax.__version__}",
                     f"jaxlib {jaxlib.__version__}",
                     f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}"])


class ProductTimings:
  """Seconds per product of each candidate form, by machine and shape, kept in a JSON file
  ({machine_key: {"ROWSxINxOUT:DTYPE": {form: seconds}}}; path None keeps them in memory).
  A file that does not parse is set aside (renamed *.corrupt) and measured anew."""

  def __init__(self, path: str | None):
    self.path = path and os.path.expanduser(path)
    self.measured = 0  # shapes measured by this instance (not read back)
    self._table: dict | None = None

  @classmethod
  def from_env(cls) -> ProductTimings:
    location = os.environ.get(CACHE_ENV, DEFAULT_CACHE)
    return cls(None if location.lower() in ("off", "0", "none", "") else location)

  def _load(self) -> dict:
    if self._table is None:
      self._table = {}
      if self.path and os.path.exists(self.path):
        try:
          with open(self.path, encoding="utf-8") as f:
            self._table = json.load(f)
          if not isinstance(self._table, dict):
            raise ValueError(f"a JSON {type(self._table).__name__}, not an object")
        except (OSError, ValueError) as e:
          _log.warning("%s: unreadable (%s); set aside as %s.corrupt and measured again",
                       self.path, e, self.path)
          os.replace(self.path, self.path + ".corrupt")
          self._table = {}
    return self._table

  def _save(self) -> None:
    if not self.path:
      return
    folder = os.path.dirname(self.path) or "."
    # Another process may have added shapes since this one read the file: keep them.
    table = self._table
    try:
      with open(self.path, encoding="utf-8") as f:
        on_disk = json.load(f)
      for machine, shapes in on_disk.items():
        table[machine] = {**shapes, **table.get(machine, {})}
    except (OSError, ValueError, AttributeError):
      pass
    try:
      os.makedirs(folder, exist_ok=True)
      with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp",
                                       encoding="utf-8") as f:
        json.dump(table, f, indent=1, sort_keys=True)
      os.replace(f.name, self.path)
    except OSError as e:  # a read-only home: the timings still hold for this process
      _log.warning("%s: not written (%s); set %s to a writable file to keep the timings",
                   self.path, e, CACHE_ENV)

  def table(self) -> dict:
    """This machine's timings: {"ROWSxINxOUT:DTYPE": {form: seconds per product}}."""
    return self._load().get(machine_key(), {})

  def seconds(self, cfg, rows: int, inputs: int, outputs: int, cache_bytes: int,
              panels: bool = False) -> dict:
    """{form: seconds per product} for this shape, measured unless already known."""
    key = f"{rows}x{inputs}x{outputs}:{jnp.dtype(cfg.param_dtype).name}>{cfg.dtype}"
    shapes = self._load().setdefault(machine_key(), {})
    forms = candidate_forms(outputs, panels)
    if sorted(shapes.get(key, {})) != sorted(str(form) for form in forms):
      shapes[key] = {str(form): t for form, t in
                     measure_forms(cfg, rows, inputs, outputs, cache_bytes, forms).items()}
      self.measured += 1
      self._save()
    return shapes[key]


def measure_forms(cfg, rows: int, inputs: int, outputs: int, cache_bytes: int,
                  forms=None, rounds: int = ROUNDS) -> dict:
  """Seconds per product of a [rows, inputs] activation by an [inputs, outputs] kernel in
  each of `forms` (default candidate_forms(outputs)), as layers.Linear runs it: every
  form compiled once as a chain over the same copies of the kernel, each round run once
  per form after reading 2 x `cache_bytes` of other memory (so the copies come from
  memory, not the cache), the best of `rounds` over the copies."""
  dtype = jnp.dtype(cfg.param_dtype)
  nbytes = inputs * outputs * dtype.itemsize
  copies = int(np.clip(-(-CHAIN_BYTES // nbytes), MIN_COPIES, MAX_COPIES))
  rng = np.random.default_rng(0)
  kernels = [jnp.asarray(rng.standard_normal((inputs, outputs), np.float32) * 0.02, dtype)
             for _ in range(copies)]
  x = jnp.asarray(rng.standard_normal((rows, inputs), np.float32), cfg.dtype)
  linear = layers.Linear(in_shape=(inputs,), out_shape=(outputs,), axes=("embed", "mlp"),
                         cfg=cfg)
  other = jnp.ones((2 * cache_bytes // 4,), jnp.float32)
  read_other = jax.jit(jnp.sum)

  @jax.jit
  def chain(params, x):
    return [linear.apply({"params": p}, x) for p in params]

  programs = {}
  for form in candidate_forms(outputs) if forms is None else forms:
    params = jax.block_until_ready([store(form, k, 1) for k in kernels])
    jax.block_until_ready(chain(params, x))  # compiles and warms
    programs[form] = params
  jax.block_until_ready(read_other(other))
  best = {form: math.inf for form in programs}
  for _ in range(rounds):
    for form, params in programs.items():
      jax.block_until_ready(read_other(other))
      start = time.perf_counter()
      jax.block_until_ready(chain(params, x))
      best[form] = min(best[form], time.perf_counter() - start)
  return {form: t / copies for form, t in best.items()}


def fastest(seconds: dict):
  """The form of the fastest entry of `seconds` ({str(form): s}); the kernel as stored
  unless another is faster by more than MIN_GAIN."""
  name = min(seconds, key=seconds.get)
  if seconds[name] >= seconds["1"] * (1 - MIN_GAIN):
    return 1
  return name if name in (TRANSPOSED, PANELS) else int(name)


def kernel_shapes(params) -> dict[tuple[int, int], bool]:
  """{(inputs, outputs): whether every projection kernel of that size can be stored in
  panels (its last output axis a multiple of cpu_matmul.PANEL)} over `params`."""
  shapes: dict[tuple[int, int], bool] = {}
  for _, in_shape, out_shape in model.projection_shapes(params):
    key = (math.prod(in_shape), math.prod(out_shape))
    shapes[key] = shapes.get(key, True) and out_shape[-1] % cpu_matmul.PANEL == 0
  return shapes


def projection_layout(cfg, params, rows: int, cache_bytes: int | None = None,
                      timings: ProductTimings | None = None):
  """forms.relayout's projection_layout for decode steps of `rows` tokens over `params`
  (model.init's tree): each kernel shape in the form measured fastest on this machine
  (ProductTimings, default from C2JAX_CPU_LAYOUT_CACHE), or None (every kernel as it is)
  when the weights fit in the last-level cache (`cache_bytes`, default
  last_level_cache_bytes())."""
  cache_bytes = last_level_cache_bytes() if cache_bytes is None else cache_bytes
  if sum(leaf.nbytes for leaf in jax.tree.leaves(params)) <= cache_bytes:
    return None
  shapes = kernel_shapes(params)
  float32 = jnp.dtype(cfg.param_dtype) == jnp.dtype(cfg.dtype) == jnp.float32
  panels = float32 and any(shapes.values()) and cpu_matmul.available()
  timings = ProductTimings.from_env() if timings is None else timings
  itemsize = jnp.dtype(cfg.param_dtype).itemsize
  start, chosen = time.perf_counter(), {}
  for (inputs, outputs), divisible in sorted(shapes.items()):
    if inputs * outputs * itemsize > MAX_MEASURED_BYTES:
      chosen[inputs, outputs] = 1
    else:
      chosen[inputs, outputs] = fastest(timings.seconds(
          cfg, rows, inputs, outputs, cache_bytes, panels=panels and divisible))
  if timings.measured:
    _log.info("cpu_decode: measured %d kernel shapes at %d rows in %.1f s: %s",
              timings.measured, rows, time.perf_counter() - start, chosen)

  def layout(name: str, inputs: int, outputs: int):
    del name
    return chosen.get((inputs, outputs), 1)
  layout.chosen = chosen
  return layout
