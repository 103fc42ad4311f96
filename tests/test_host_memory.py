"""host_memory.retain_freed_memory: large buffers come from the heap and stay there when
freed (glibc's mallinfo2 counts mmapped blocks and free heap bytes)."""

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from c2jax import host_memory

# Allocates a 64 MiB buffer, prints whether retain applied, the mmapped blocks it added, and the free heap bytes after it is freed.
_CHILD = textwrap.dedent("""
    import ctypes
    import numpy as np
    from c2jax import host_memory

    class Info(ctypes.Structure):
      _fields_ = [(name, ctypes.c_size_t) for name in (
          "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
          "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Info
    print(host_memory.retain_freed_memory())
    blocks = libc.mallinfo2().hblks
    buffer = np.empty(64 << 20, np.uint8); buffer.fill(1)
    print(libc.mallinfo2().hblks - blocks)
    del buffer
    print(libc.mallinfo2().fordblks)
""")


def _child(env_value):
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  env.pop(host_memory.ENV_VAR, None)
  if env_value is not None:
    env[host_memory.ENV_VAR] = env_value
  out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                       text=True, check=True).stdout.split()
  return out[0] == "True", int(out[1]), int(out[2])


@pytest.mark.skipif(host_memory._glibc() is None or not hasattr(ctypes.CDLL(None), "mallinfo2"),
                    reason="mallopt and mallinfo2 are glibc's (>= 2.33)")
def test_large_buffers_come_from_the_heap_and_stay_after_free():
  applied, new_mmapped_blocks, free_heap = _child(None)
  assert applied and new_mmapped_blocks == 0 and free_heap >= 64 << 20
  applied, new_mmapped_blocks, free_heap = _child("0")  # glibc's default: a fresh mmap
  assert not applied and new_mmapped_blocks == 1 and free_heap < 64 << 20
