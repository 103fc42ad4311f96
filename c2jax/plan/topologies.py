"""TPU topologies by their Cloud names, as compile-only devices of the real TPU compiler.

    target = parse_target("v5p-8", slices=1)     # 4 TPU v5p chips, topology 'v5p:2x2x1'
    devices = target.devices()                   # compile-only: nothing runs on them

Names follow GKE, `gcloud` and MaxText (`compile_topology=v5p-8`): `<generation>-<N>` with N
the TensorCores for the megacore generations (v4, v5p: two per chip, one JAX device per
chip) and the chips for the single-core ones (v5e, v6e). The chip grid is the slice shape
Cloud TPU provisions for that size (v5p-8 2x2x1, v5p-16 2x2x2, ... v5p-1024 8x8x8; v6e-256
16x16); 3-D slices whose sides are multiples of 4 are tori (wraparound links). `slices` > 1
joins copies over the data-centre network (multi-slice), and the mesh then spans them with
its data-like axes (c2jax.parallel.mesh.dcn_shape).

The devices come from libtpu's compiler (`jax.experimental.topologies`), which runs on any
CPU machine: `pip install -e ".[tpu-compile]"`. The process's own backend stays the CPU;
the steps trace under a mesh of these devices, which makes the kernels pick their TPU
implementations (c2jax_kernels.target_platform).
"""

from __future__ import annotations

import dataclasses
import math
import re

from c2jax.plan import accelerators

INSTALL_HINT = ('the TPU compiler (libtpu) is not installed; install the extra: '
                'pip install -e ".[tpu-compile]" (tools/setup.sh does).')


@dataclasses.dataclass(frozen=True)
class Generation:
  cores_per_chip: int   # TensorCores a chip has (the N of a name counts them)
  dims: int             # 3: 3-D torus (v4, v5p); 2: 2-D (v5e, v6e)
  accelerator: str      # key of accelerators.ACCELERATORS
  chip_config: str      # libtpu's chip config: 'megacore' joins a chip's two cores
  min_chips: int


GENERATIONS = {
    "v4": Generation(2, 3, "tpu_v4", "megacore", 4),
    "v5p": Generation(2, 3, "tpu_v5p", "megacore", 4),
    "v5e": Generation(1, 2, "tpu_v5e", "default", 1),
    "v6e": Generation(1, 2, "tpu_v6e", "default", 1),
}
_ALIASES = {"v5litepod": "v5e"}
_NAME = re.compile(r"^(v4|v5p|v5e|v5litepod|v6e)-(\d+)$")


def chip_grid(chips: int, dims: int) -> tuple[int, ...]:
  """The slice shape of `chips` chips: doubling the last of the shortest sides from 2x2x1
  (3-D) or 1x1 (2-D), which gives Cloud TPU's shapes (16 -> 2x2x4, 64 -> 4x4x4)."""
  grid = [2, 2, 1] if dims == 3 else [1, 1]
  while math.prod(grid) < chips:
    shortest = min(grid)
    last = max(i for i, side in enumerate(grid) if side == shortest)
    grid[last] *= 2
  return tuple(grid)


@dataclasses.dataclass(frozen=True)
class Target:
  name: str                   # as given, e.g. 'v5p-8'
  generation: str             # 'v5p'
  chips: int                  # per slice
  slices: int
  grid: tuple[int, ...]       # chips per side, one slice

  @property
  def spec(self) -> Generation:
    return GENERATIONS[self.generation]

  @property
  def accelerator(self) -> accelerators.Accelerator:
    return accelerators.ACCELERATORS[self.spec.accelerator]

  @property
  def num_devices(self) -> int:
    return self.chips * self.slices

  @property
  def topology_name(self) -> str:
    return f"{self.generation}:{'x'.join(map(str, self.grid))}"

  def label(self) -> str:
    return self.name + (f" x {self.slices} slices" if self.slices > 1 else "")

  def devices(self) -> list:
    """The compile-only devices (one per chip), slice by slice."""
    try:
      from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
      import libtpu  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      raise SystemExit(f"c2jax plan --target={self.name}: {INSTALL_HINT}") from None
    spec = self.spec
    host = (2, 2, 1) if self.chips >= 4 else (*self.grid, 1)[:3]
    kwargs = dict(chip_config_name=spec.chip_config, chips_per_host_bounds=host,
                  num_slices=self.slices)
    if spec.dims == 3 and all(side % 4 == 0 for side in self.grid):
      kwargs["wrap"] = (True, True, True)
    return list(topologies.get_topology_desc(self.topology_name, "tpu", **kwargs).devices)


def parse_target(name: str, slices: int = 1) -> Target:
  """A Target from a Cloud TPU name ('v5p-8', 'v6e-256', 'v4-16'); raises ValueError."""
  match = _NAME.match(name.strip().lower())
  if not match:
    raise ValueError(f"--target={name!r}: expected cpu or a Cloud TPU slice name, e.g. "
                     f"v5p-8, v5e-16, v6e-256 or v4-8 (generations {sorted(GENERATIONS)}).")
  generation = _ALIASES.get(match.group(1), match.group(1))
  spec, count = GENERATIONS[generation], int(match.group(2))
  chips, remainder = divmod(count, spec.cores_per_chip)
  if remainder or chips < spec.min_chips or chips & (chips - 1):
    unit = "TensorCores (2 per chip)" if spec.cores_per_chip == 2 else "chips"
    raise ValueError(f"--target={name!r}: {generation}-N counts {unit}; N must give a "
                     f"power of two of at least {spec.min_chips} chips, e.g. "
                     f"{generation}-{spec.min_chips * spec.cores_per_chip}.")
  if slices < 1:
    raise ValueError(f"--target_slices={slices}: use 1 or more slices.")
  return Target(name, generation, chips, int(slices), chip_grid(chips, spec.dims))
