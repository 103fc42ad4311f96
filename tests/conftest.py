"""Suite-wide settings: a persistent XLA compilation cache shared by every test process.

Test processes (pytest-xdist workers and the CLI subprocesses that job tests start)
compile many identical programs; sharing compiled executables through one on-disk cache
keeps the suite's wall time down. Set C2JAX_XLA_CACHE=off to disable. And a lower XLA
backend optimisation level for every test process (below).
"""

import os
import tempfile

import pytest

os.environ.setdefault("C2JAX_XLA_CACHE", os.path.join(tempfile.gettempdir(), "c2jax-test-xla-cache"))
# Cache every program, however fast it compiles: the suite's processes compile the same
# small programs over and over, and on 2 cores those add up.
os.environ.setdefault("C2JAX_XLA_CACHE_MIN_SECS", "0")
# XLA's backend at -O0: the suite's programs are tiny and compiled once or a few times each,
# so compiling dominates and running barely shows; -O0 compiles them 2-2.5x faster (a tiny
# pretraining run from a cold cache: 20-22 s -> 15-17 s). `import c2jax` applies it to
# every process the tests start. Set C2JAX_XLA_BACKEND_OPT_LEVEL=2 for XLA's default.
os.environ.setdefault("C2JAX_XLA_BACKEND_OPT_LEVEL", "0")
# A decode engine over weights larger than the last-level cache times its projection forms
# (c2jax.rollout.cpu_decode): keep the suite's timings out of the user's cache.
os.environ.setdefault("C2JAX_CPU_LAYOUT_CACHE",
                      os.path.join(tempfile.gettempdir(), "c2jax-test-cpu-layout.json"))
# And c2jax_kernels.cpu_matmul's library, built once for the suite's processes.
os.environ.setdefault("C2JAX_KERNEL_CACHE", os.path.join(tempfile.gettempdir(),
                                                         "c2jax-test-kernels"))

from c2jax import compile_cache  # noqa: E402

compile_cache.enable()


def pytest_collection_modifyitems(config, items):
  """The heavy tests (marked slow) first, in their collected order: pytest-xdist hands
  tests out in this order, so the long ones start early and the short ones fill in around
  them instead of one worker finishing a long test alone at the end."""
  del config
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
  """One data cache (corpora and tokenizers) for every job test of the run, shared by the
  pytest-xdist workers: c2jax.data.cache keys each corpus and tokenizer by its settings
  and builds it once, under a file lock, so the first job of each settings builds it and
  the others read it."""
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent  # the run's folder, above each worker's own
  path = base / "data_cache"
  path.mkdir(exist_ok=True)
  return path


@pytest.fixture(scope="session")
def slurm():
  """The one-node SLURM of tools/setup_slurm.sh, started if needed (root), else a skip."""
  from tests import slurm_testlib  # pylint: disable=g-import-not-at-top

  slurm_testlib.start_cluster()
