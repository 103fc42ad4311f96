"""c2jax: a JAX/Flax reproduction of the Composer 2 coding-agent training system.

Public faces: `c2jax.model` (the MoE transformer) and `c2jax.hf` (HF checkpoint interop).

    C2JAX_XLA_BACKEND_OPT_LEVEL=N   XLA's backend (LLVM) optimisation level, 0-3, for every
                                    process that imports c2jax (and those they start);
                                    unset, XLA's default (2). The test suite sets 0: on CPU
                                    its tiny programs compile 2-2.5x faster, the same
                                    arithmetic less optimised. Not for training or benchmarks.
"""

import os as _os

__version__ = "0.1.0"

_OPT_LEVEL_FLAG = "--xla_backend_optimization_level"


def _apply_backend_opt_level(environ=_os.environ) -> None:
  """Adds C2JAX_XLA_BACKEND_OPT_LEVEL to XLA_FLAGS, which JAX's backend reads once when it
  starts (after this import); a level already in XLA_FLAGS wins."""
  raw = environ.get("C2JAX_XLA_BACKEND_OPT_LEVEL", "")
  if not raw:
    return
  if raw not in ("0", "1", "2", "3"):
    raise ValueError(f"C2JAX_XLA_BACKEND_OPT_LEVEL={raw!r} is not an optimisation level; "
                     "set 0, 1, 2 or 3, or unset it for XLA's default.")
  flags = environ.get("XLA_FLAGS", "")
  if _OPT_LEVEL_FLAG not in flags:
    environ["XLA_FLAGS"] = f"{flags} {_OPT_LEVEL_FLAG}={raw}".strip()


_apply_backend_opt_level()
