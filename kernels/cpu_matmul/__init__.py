"""A few-row float32 matmul for XLA:CPU decode steps, over weights packed in column panels.

    panels = pack(kernel_KxN)                 # [N / PANEL, K, PANEL], N a multiple of PANEL
    y_MxN = panel_matmul(x_MxK, panels)       # x @ kernel, float32
    available() -> bool; unavailable_reason() -> str | None

XLA:CPU's products of a few rows by a weight that streams from memory run at about half
the memory's bandwidth (they pack the weight on every call); OpenBLAS is no faster
(docs/benchmarks.md, "A few-row matmul kernel for CPU decode"). This one reads each
32-column panel once, front to back, into up to 8 rows at a time held in registers,
the panels shared out over XLA's intra-op threads: panel_matmul.cc, an XLA FFI handler.

It is C++ compiled on first use for the machine it runs on (`$CXX`, else g++ or c++;
`-O3 -march=native`, then without -march if that fails), against jaxlib's FFI headers,
and kept in C2JAX_KERNEL_CACHE (default ~/.cache/c2jax/kernels) under a name hashing the
source, the compiler, jaxlib and the CPU, so each machine builds it once. Without a
working compiler available() is False, unavailable_reason() says why, and panel_matmul
raises; c2jax's CPU decode layout then does not offer the form
(c2jax.rollout.cpu_decode). No gradient: decode engines only.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading

import jax
import jax.numpy as jnp

PANEL = 32
# Rows up to which a decode layout's Linear multiplies by the panels with this kernel;
# larger prefill chunks run XLA's matmul on the unpacked kernel, whose per-call packing of
# the weight pays over many rows. (`qwen3_small` prefill at batch 1, 2026-12-03: 1.18x
# with the kernel for a 512-token chunk, 0.96x for a 4,096-token one.)
MAX_ROWS = 1024
TARGET = "c2jax_panel_matmul"
SOURCE = pathlib.Path(__file__).with_name("panel_matmul.cc")
CACHE_ENV, DEFAULT_CACHE = "C2JAX_KERNEL_CACHE", "~/.cache/c2jax/kernels"

_lock = threading.Lock()
_state: dict = {}  # "library": path once registered, or "error": why not


def pack(kernel: jax.Array) -> jax.Array:
  """[K, N] -> [N / PANEL, K, PANEL]: column panels, each panel's K rows contiguous."""
  k, n = kernel.shape
  if n % PANEL:
    raise ValueError(f"cpu_matmul.pack: {n} columns are not a multiple of {PANEL}.")
  return jnp.transpose(kernel.reshape(k, n // PANEL, PANEL), (1, 0, 2))


def unpack(panels: jax.Array) -> jax.Array:
  """Inverse of pack."""
  count, k, width = panels.shape
  return jnp.transpose(panels, (1, 0, 2)).reshape(k, count * width)


def cpu_identity() -> str:
  """The CPU as /proc/cpuinfo's first processor names it (vendor, family, model,
  stepping, name, flags), else the machine type."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      block = f.read().split("\n\n")[0]
  except OSError:
    return os.uname().machine
  keep = ("vendor_id", "cpu family", "model", "stepping", "model name", "flags", "Features",
          "CPU implementer", "CPU part")
  return "\n".join(line for line in block.splitlines()
                   if line.split(":")[0].strip() in keep)


def _compiler() -> str | None:
  return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _build() -> pathlib.Path:
  compiler = _compiler()
  if not compiler:
    raise RuntimeError("no C++ compiler: set CXX, or install g++ (Debian: apt-get install "
                       "g++)")
  try:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
  except OSError as e:
    raise RuntimeError(f"the C++ compiler {compiler!r} does not run ({e}); set CXX to a "
                       "working one, or install g++") from None
  import jaxlib  # pylint: disable=import-outside-toplevel
  source = SOURCE.read_bytes()
  digest = hashlib.sha256(b"\0".join([
      source, compiler.encode(), version.encode(), jaxlib.__version__.encode(),
      cpu_identity().encode()])).hexdigest()[:16]
  folder = pathlib.Path(os.path.expanduser(os.environ.get(CACHE_ENV, DEFAULT_CACHE)))
  library = folder / f"panel_matmul-{digest}.so"
  if library.exists():
    return library
  folder.mkdir(parents=True, exist_ok=True)
  errors = []
  for arch in (["-march=native"], []):
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".so.tmp", delete=False) as out:
      pass
    command = [compiler, "-O3", *arch, "-std=c++17", "-shared", "-fPIC",
               "-I", jax.ffi.include_dir(), str(SOURCE), "-o", out.name]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode == 0:
      os.replace(out.name, library)  # atomic: processes building at once agree
      return library
    os.unlink(out.name)
    errors.append(f"{' '.join(command)}:\n{done.stderr[-2000:]}")
  raise RuntimeError("compiling panel_matmul.cc failed:\n" + "\n".join(errors))


def _load() -> None:
  with _lock:
    if _state:
      return
    try:
      library = _build()
      handler = ctypes.CDLL(str(library))[TARGET]
      jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handler), platform="cpu")
      _state["library"] = library
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
      _state["error"] = str(e)


def available() -> bool:
  """Whether panel_matmul runs here (builds and loads the kernel on the first call)."""
  _load()
  return "library" in _state


def unavailable_reason() -> str | None:
  _load()
  return _state.get("error")


def panel_matmul(x: jax.Array, panels: jax.Array) -> jax.Array:
  """x [..., K] @ the kernel that pack() turned into `panels` [N / PANEL, K, PANEL]:
  [..., N], float32. XLA:CPU only."""
  if not available():
    raise RuntimeError(f"cpu_matmul.panel_matmul is not available: {_state['error']}")
  count, k, width = panels.shape
  if width != PANEL or x.shape[-1] != k:
    raise ValueError(f"panel_matmul: x {x.shape} by panels {panels.shape}; want x [..., K] "
                     f"and panels [N / {PANEL}, K, {PANEL}] (cpu_matmul.pack).")
  if x.dtype != jnp.float32 or panels.dtype != jnp.float32:
    raise ValueError(f"panel_matmul: float32 only; got x {x.dtype}, panels {panels.dtype}.")
  lead = x.shape[:-1]
  rows = x.reshape(-1, k)
  y = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((rows.shape[0], count * PANEL),
                                                    jnp.float32))(rows, panels)
  return y.reshape(*lead, count * PANEL)
