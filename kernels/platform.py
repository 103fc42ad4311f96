"""The platform a traced program compiles for, which picks kernels and interpret mode.

The running process's backend is not always the target: `c2jax plan --target=v5p-8`
traces the steps in a CPU process for compile-only TPU devices. Every c2jax runtime (train,
RL learner, engine, plan) traces its steps under `jax.set_mesh(mesh)`, and the mesh's
abstract device names the platform its devices belong to; without a mesh in force, the
target is JAX's default backend.
"""

import importlib
import importlib.util

import jax


def target_platform() -> str:
  """'cpu' | 'gpu' | 'tpu': the platform of the mesh in force, else JAX's backend."""
  device = getattr(jax.sharding.get_abstract_mesh(), 'abstract_device', None)
  if device is not None:
    return device.platform
  return jax.default_backend()


def target_device():
  """A device the traced program compiles for: the first of the concrete mesh in force
  (compile-only devices under `c2jax plan --target`), else JAX's first device. Kernels read
  a GPU's compute capability from it."""
  # jax.sharding.get_mesh() refuses to run under jit, where kernels choose their path;
  # the mesh it returns is this one.
  from jax._src import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  mesh = mesh_lib.get_concrete_mesh()
  if mesh is not None and not mesh.empty:  # the empty mesh's devices are array(None)
    return mesh.devices.flat[0]
  return jax.devices()[0]


def gpu_major(device=None) -> int | None:
  """The compute capability's major version of an NVIDIA device (9: Hopper, 10:
  Blackwell), None for other devices (CPU, TPU, ROCm's gfx names)."""
  device = device or target_device()
  if device.platform != 'gpu':
    return None
  major = str(getattr(device, 'compute_capability', '')).split('.')[0]
  return int(major) if major.isdigit() else None


class LazyModule:
  """A module imported on first attribute access. The Mosaic GPU kernels use it for
  `jax.experimental.pallas.mosaic_gpu`, whose import costs about half a second that every
  process importing the model would otherwise pay, GPU or not."""

  def __init__(self, name: str):
    self._name = name

  def __getattr__(self, attr: str):
    return getattr(importlib.import_module(self._name), attr)


LIBRARY = 'tokamax'  # the field's kernel library (the `kernels` extra; docs/kernels.md)


def library_installed() -> bool:
  return importlib.util.find_spec(LIBRARY) is not None


def library(feature: str):
  """tokamax, imported on first use (it imports its profiler tooling: ~1 s); without it an
  ImportError naming the `feature` that needs it and how to install it."""
  try:
    return importlib.import_module(LIBRARY)
  except ImportError as error:
    raise ImportError(f"{feature} needs the {LIBRARY} package: pip install -e '.[kernels]' "
                      "(setup.py pins the tested release).") from error
