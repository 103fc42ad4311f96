"""Keep freed host memory in the process, so XLA:CPU's large buffers are not page-faulted
in again on every step.

glibc serves allocations above M_MMAP_THRESHOLD (at most 32 MiB by default) with fresh
mmap()s and returns them to the kernel on free, so each training step re-faults every
large buffer it allocates: on 2026-11-25 a `small` train step spent ~5% of its time in
three zero-fills of scan buffers ([7, 16, 512, 256] stacked expert gradients, the
[7, 8, 8, 256, 256] saved attention probabilities), most of it first-touch page faults.
`retain_freed_memory` raises the mmap threshold to 1 GiB and the trim threshold to 2 GiB,
so such buffers come from the heap and stay mapped for the next step (the cost: the
process keeps its peak heap resident). The CLI calls it at start-up; C2JAX_RETAIN_FREED_MEMORY=0
turns it off. Only glibc Linux has these knobs; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt parameters (glibc malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 30
TRIM_THRESHOLD_BYTES = 2**31 - 1
ENV_VAR = "C2JAX_RETAIN_FREED_MEMORY"


def _glibc():
  if not sys.platform.startswith("linux"):
    return None
  name = ctypes.util.find_library("c")
  try:
    libc = ctypes.CDLL(name)
    libc.gnu_get_libc_version  # only glibc has it (musl does not)
  except (OSError, AttributeError, TypeError):
    return None
  return libc


def retain_freed_memory() -> bool:
  """Large allocations from the heap, freed memory kept: True when applied; False when
  off by ENV_VAR=0 or not on glibc."""
  if os.environ.get(ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
    return False
  libc = _glibc()
  if libc is None:
    return False
  applied = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
  return libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and applied
