"""Suite-wide settings: a persistent XLA compilation cache shared by every test process.

Test processes (pytest-xdist workers and the CLI subprocesses that job tests start)
compile many identical programs; sharing compiled executables through one on-disk cache
keeps the suite's wall time down. Set C2JAX_XLA_CACHE=off to disable. And a lower XLA
backend optimisation level for every test process (below).
"""

import os
import pathlib
import subprocess
import sys
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


TESTS = pathlib.Path(__file__).resolve().parent
_ENV_IMAGES: list[subprocess.Popen] = []


def _runs_env_tests(config) -> bool:
  """Whether the run's paths (none: testpaths) hold tests/env, or are inside it."""
  env = TESTS / "env"
  for arg in config.args or [str(TESTS)]:
    path = pathlib.Path(str(arg).split("::")[0]).resolve()
    if path == env or env in path.parents or path in env.parents:
      return True
  return False


def pytest_configure(config):
  """In the run's main process, when tests/env is in the run and Docker answers: the
  docker backend's environment images (Go, node, Rust: c2jax/env/env_images.py) start
  building in the background. They are 0.4-1 GB of files each, so building them is disk
  and docker work more than CPU, and it overlaps the tests that run meanwhile; a test
  that needs one before it is ready waits for it on its lock instead of building it a
  second time. The build's output: c2jax-test-env-images.log in the temporary folder."""
  if hasattr(config, "workerinput") or not _runs_env_tests(config):
    return  # a pytest-xdist worker, or a run that needs no images
  from tests.env import env_testlib  # pylint: disable=g-import-not-at-top

  if env_testlib.real_docker_engine():
    return  # no engine or no sandbox image: the docker tests skip
  log = open(os.path.join(tempfile.gettempdir(), "c2jax-test-env-images.log"), "w")
  # In the order the suite first needs them (tests/env/test_languages.py: node, rust).
  _ENV_IMAGES.append(subprocess.Popen(
      [sys.executable, "-m", "c2jax.env.env_images", "node", "rust", "go"],
      cwd=TESTS.parent, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
  log.close()


def pytest_unconfigure(config):
  del config
  for process in _ENV_IMAGES:
    if process.poll() is None:
      process.terminate()
    process.wait()


# What a slow test weighs against an unmarked one when ordering the modules below: the
# marked ones take 15 s to 2 min, most others well under 2 s.
SLOW_WEIGHT = 30


def xdist_scope(nodeid: str) -> str:
  """pytest-xdist's unit of work under --dist loadscope (pytest.ini): a test module, or a
  class inside one."""
  return nodeid.rsplit("::", 1)[0]


def pytest_collection_modifyitems(config, items):
  """The heaviest modules first, each kept whole. pytest.ini runs pytest-xdist with
  --dist loadscope: every module (its module fixtures built once) goes to whichever worker
  is free, in this order, so the long modules start early and the short ones fill in
  around them instead of one worker finishing a long one alone at the end. (With xdist's
  default `load`, the first quarter of the tests goes to each worker as one consecutive
  block: every slow test, sorted first, landed on one worker, and the other ran out of
  work a third of the way through.) A module weighs its slow tests at SLOW_WEIGHT and
  every other at 1; the sort is stable, so a module's tests keep their order."""
  del config
  weight, first = {}, {}
  for index, item in enumerate(items):
    scope = xdist_scope(item.nodeid)
    first.setdefault(scope, index)
    weight[scope] = weight.get(scope, 0) + (
        SLOW_WEIGHT if item.get_closest_marker("slow") is not None else 1)
  items.sort(key=lambda item: (-weight[xdist_scope(item.nodeid)], first[xdist_scope(item.nodeid)]))


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
