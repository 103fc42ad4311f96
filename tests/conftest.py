"""Suite-wide settings: a persistent XLA compilation cache shared by every test process.

Test processes (pytest-xdist workers and the CLI subprocesses that job tests start)
compile many identical programs; sharing compiled executables through one on-disk cache
keeps the suite's wall time down. Set C2JAX_XLA_CACHE=off to disable.
"""

import os
import tempfile

os.environ.setdefault("C2JAX_XLA_CACHE", os.path.join(tempfile.gettempdir(), "c2jax-test-xla-cache"))
# Cache every program, however fast it compiles: the suite's processes compile the same
# small programs over and over, and on 2 cores those add up.
os.environ.setdefault("C2JAX_XLA_CACHE_MIN_SECS", "0")

from c2jax import compile_cache  # noqa: E402

compile_cache.enable()
