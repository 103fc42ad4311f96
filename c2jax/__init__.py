"""c2jax: a JAX/Flax reproduction of the Composer 2 coding-agent training system.

Public faces: `c2jax.model` (the MoE transformer) and `c2jax.hf` (HF checkpoint interop).

    C2JAX_XLA_BACKEND_OPT_LEVEL=N   XLA's backend (LLVM) optimisation level, 0-3, for every
                                    process that imports c2jax (and those they start);
                                    unset, XLA's default (2). The test suite sets 0: on CPU
                                    its tiny programs compile 2-2.5x faster, the same
                                    arithmetic less optimised. Not for training or benchmarks.

On a machine without TPU chips, importing c2jax also keeps libtpu (the `tpu-compile`
extra, the compiler of `c2jax plan --target=v5p-*`) quiet when JAX starts (see
_quiet_absent_tpu).
"""

import glob as _glob
import importlib.util as _importlib_util
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


_GOOGLE_PCI_VENDOR = "0x1ae0"
# Google PCI functions that are not TPUs (gVNIC, Persistent Disk NVMe): a Cloud CPU VM has
# them. Any other Google device may be a TPU, of a generation this list need not know.
_GOOGLE_NOT_TPU = frozenset({"0x0042", "0x001f"})


def _tpu_may_be_present(pci_devices: str = "/sys/bus/pci/devices", dev: str = "/dev") -> bool:
  """True unless this machine surely has no TPU chip: none of its PCI functions is a
  Google device other than a network or disk one, and it has no /dev/accel* (TPU v2-v4)
  or /dev/vfio devices (v5 and later)."""
  if _glob.glob(_os.path.join(dev, "accel*")) or _glob.glob(_os.path.join(dev, "vfio", "[0-9]*")):
    return True
  for vendor_path in _glob.glob(_os.path.join(pci_devices, "*", "vendor")):
    try:
      with open(vendor_path) as f:
        if f.read().strip() != _GOOGLE_PCI_VENDOR:
          continue
      with open(_os.path.join(_os.path.dirname(vendor_path), "device")) as f:
        if f.read().strip() not in _GOOGLE_NOT_TPU:
          return True
    except OSError:
      return True  # an unreadable Google function: assume the worst
  return False


def _quiet_absent_tpu(environ=_os.environ, **probe) -> None:
  """Where libtpu is installed but the machine has no TPU, JAX still loads it when it
  starts, and libtpu, finding neither chips nor Cloud TPU metadata, prints errors ("Failed
  to find host bounds for accelerator type", "INVALID_ARGUMENT: unexpected worker
  hostname") that read as a broken install. It prints them for want of a host layout, so
  this declares the one-host layout it looks for: TPU_HOST_BOUNDS=1,1,1 and
  TPU_WORKER_HOSTNAMES=localhost. Without chips they set nothing else (a deviceless compile
  passes its topology and host bounds explicitly: c2jax.plan.topologies). A value already
  set, any TPU_ACCELERATOR_TYPE, or a machine that may hold a TPU leaves all as it is.
  `probe`: _tpu_may_be_present's paths, for tests."""
  if ("TPU_ACCELERATOR_TYPE" in environ or _importlib_util.find_spec("libtpu") is None
      or _tpu_may_be_present(**probe)):
    return
  environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")
  environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


_apply_backend_opt_level()
_quiet_absent_tpu()
