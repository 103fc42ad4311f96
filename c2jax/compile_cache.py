"""The persistent XLA compilation cache every c2jax process shares.

A resumed job, the next phase of a pipeline, and every actor process of an RL run compile
the same programs; with the cache on, each is compiled once per machine and loaded from
disk after that. `c2jax.cli` turns it on for every verb; processes that start without the
cli (RL actors, test subprocesses) call `enable()` themselves.

    C2JAX_XLA_CACHE=DIR             where (default ~/.cache/c2jax/xla); `off` disables it
    C2JAX_XLA_CACHE_MIN_SECS=SECS   skip programs that compile faster (default 1); the
                                    test suite sets 0, its processes compile the same small
                                    programs many times over
"""

import os

DEFAULT_DIR = "~/.cache/c2jax/xla"


def enable() -> None:
  location = os.environ.get("C2JAX_XLA_CACHE", DEFAULT_DIR)
  if location.lower() in ("off", "0", "none", ""):
    return
  import jax  # pylint: disable=g-import-not-at-top  (keeps this module free of jax)

  raw = os.environ.get("C2JAX_XLA_CACHE_MIN_SECS", "1")
  try:
    min_secs = float(raw)
  except ValueError:
    raise ValueError(f"C2JAX_XLA_CACHE_MIN_SECS={raw!r} is not a number of seconds; set "
                     "e.g. 1 (the default), or 0 to cache every program.") from None
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(location))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", min_secs)
