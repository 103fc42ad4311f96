"""Compile targets by name: TPU slices and NVIDIA GPU nodes, as compile-only devices.

    target = parse_target("v5p-8", slices=1)     # 4 TPU v5p chips, topology 'v5p:2x2x1'
    target = parse_target("h100-16")             # 2 HGX nodes of 8 H100s
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

GPU targets are `<chip>-<N>` with N the GPUs (h100, h200, b200, b300; 1, 2 or 4 on one node, else
whole nodes of 8 joined by the scale-out network). XLA's GPU compiler compiles for them
without a GPU when its CUDA plugin is installed (`pip install -e ".[gpu-compile]"`, best in
a virtualenv of its own: with the plugin present every JAX process looks for a GPU at
start). The plugin needs a description of the chip instead of a device to query:
`GpuChip.target_config` writes one (a `stream_executor.GpuTargetConfigProto` in text form)
from the datasheet figures below. XLA's GPU compiler has no cost model for such devices
(`cost_analysis()` is empty), so GPU targets give memory and collectives, not time.
"""

from __future__ import annotations

import dataclasses
import math
import re

from c2jax.plan import accelerators

INSTALL_HINT = ('the TPU compiler (libtpu) is not installed; install the extra: '
                'pip install -e ".[tpu-compile]" (tools/setup.sh does).')
GPU_INSTALL_HINT = ("XLA's GPU compiler (the CUDA plugin) is not installed; install the "
                    'extra in a virtualenv of its own: python3 -m venv .venv-gpu && '
                    '.venv-gpu/bin/pip install -e ".[gpu-compile]" (tools/setup_gpu_compile.sh '
                    'does), then run .venv-gpu/bin/c2jax plan ... --target=NAME.')


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

  compiler = "TPU compiler"
  has_cost_model = True

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


@dataclasses.dataclass(frozen=True)
class GpuChip:
  """What XLA's GPU compiler needs to know of a chip it cannot query (datasheet figures)."""
  accelerator: str            # key of accelerators.ACCELERATORS
  device_name: str            # as CUDA names the device (jax's device_kind)
  compute_capability: tuple[int, int]
  sms: int
  memory_bytes: int
  hbm_bytes_per_s: float
  l2_bytes: int
  clock_ghz: float            # boost clock of the SMs
  shared_memory_per_sm: int = 233_472         # 228 KiB on Hopper and Blackwell
  shared_memory_per_block_optin: int = 232_448
  gpus_per_node: int = 8      # an HGX / DGX board: NVLink inside, the network between

  def target_config(self, dnn_version: tuple[int, int, int]) -> str:
    """The chip as a GpuTargetConfigProto in text form (the CUDA plugin's target_config)."""
    major, minor = self.compute_capability
    fields = [
        ("threads_per_block_limit", 1024), ("threads_per_warp", 32),
        ("shared_memory_per_block", 49_152),
        ("shared_memory_per_block_optin", self.shared_memory_per_block_optin),
        ("shared_memory_per_core", self.shared_memory_per_sm),
        ("threads_per_core_limit", 2048), ("core_count", self.sms), ("fpus_per_core", 128),
        ("block_dim_limit_x", 2**31 - 1), ("block_dim_limit_y", 65_535),
        ("block_dim_limit_z", 65_535), ("memory_bandwidth", int(self.hbm_bytes_per_s)),
        ("l2_cache_size", self.l2_bytes), ("clock_rate_ghz", self.clock_ghz),
        ("device_memory_size", self.memory_bytes), ("registers_per_core_limit", 65_536),
        ("registers_per_block_limit", 65_536)]
    info = "\n".join(f"  {key}: {value}" for key, value in fields)
    return (f"gpu_device_info {{\n{info}\n  cuda_compute_capability {{ major: {major} "
            f"minor: {minor} }}\n}}\nplatform_name: \"CUDA\"\n"
            f"dnn_version_info {{ major: {dnn_version[0]} minor: {dnn_version[1]} "
            f"patch: {dnn_version[2]} }}\ndevice_description_str: \"{self.device_name}\"\n")


# NVIDIA's datasheets (SXM parts): SMs, HBM size and bandwidth, L2, boost clock.
GPUS = {
    "h100": GpuChip("h100", "NVIDIA H100 80GB HBM3", (9, 0), 132, 80 * 2**30, 3.35e12,
                    50 * 2**20, 1.98),
    "h200": GpuChip("h200", "NVIDIA H200", (9, 0), 132, 141 * 10**9, 4.8e12, 50 * 2**20,
                    1.98),
    "b200": GpuChip("b200", "NVIDIA B200", (10, 0), 148, 180 * 10**9, 8.0e12, 126 * 2**20,
                    1.965),
    # Blackwell Ultra (sm_103). NVIDIA describes the full die's 160 SMs; the enabled count,
    # L2 and clock are taken as the B200's (not published per HGX part when this was
    # written): they size grids and XLA's heuristics, not what compiles.
    "b300": GpuChip("b300", "NVIDIA B300", (10, 3), 148, 288 * 10**9, 8.0e12, 126 * 2**20,
                    1.965),
}
_GPU_NAME = re.compile(r"^(h100|h200|b200|b300)-(\d+)$")


def _cudnn_version() -> tuple[int, int, int]:
  """The cuDNN the CUDA plugin came with (it picks fused attention by version)."""
  try:
    from importlib import metadata  # pylint: disable=g-import-not-at-top
    parts = [int(p) for p in metadata.version("nvidia-cudnn-cu12").split(".")[:3]]
    return (parts + [0, 0, 0])[:3]
  except Exception:  # pylint: disable=broad-except  (no wheel: a recent cuDNN 9)
    return (9, 8, 0)


@dataclasses.dataclass(frozen=True)
class GpuTarget:
  """N GPUs of one kind: one node (1, 2, 4 or 8 GPUs) or whole nodes."""
  name: str                   # as given, e.g. 'h100-16'
  chip: str                   # key of GPUS
  gpus: int

  compiler = "GPU compiler"
  has_cost_model = False      # XLA's GPU cost analysis is empty for compile-only devices
  slices = 1

  @property
  def spec(self) -> GpuChip:
    return GPUS[self.chip]

  @property
  def accelerator(self) -> accelerators.Accelerator:
    return accelerators.ACCELERATORS[self.spec.accelerator]

  @property
  def num_devices(self) -> int:
    return self.gpus

  @property
  def nodes(self) -> int:
    return max(1, self.gpus // self.spec.gpus_per_node)

  @property
  def topology_name(self) -> str:
    """XLA's GPU topology: slices x hosts x devices per host."""
    return f"1x{self.nodes}x{self.gpus // self.nodes}"

  def label(self) -> str:
    return self.name

  def devices(self) -> list:
    """The compile-only GPUs, node by node."""
    try:
      from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
      import jax_plugins.xla_cuda12  # noqa: F401  pylint: disable=g-import-not-at-top
    except ImportError:
      raise SystemExit(f"c2jax plan --target={self.name}: {GPU_INSTALL_HINT}") from None
    config = self.spec.target_config(_cudnn_version())
    return list(topologies.get_topology_desc(
        self.chip, "cuda", target_config=config, topology=self.topology_name).devices)


AnyTarget = Target | GpuTarget


def parse_target(name: str, slices: int = 1) -> AnyTarget:
  """A Target from a Cloud TPU name ('v5p-8', 'v6e-256', 'v4-16') or a GpuTarget from a
  GPU count ('h100-8', 'b200-64'); raises ValueError."""
  gpu = _GPU_NAME.match(name.strip().lower())
  if gpu:
    chip, count = gpu.group(1), int(gpu.group(2))
    per_node = GPUS[chip].gpus_per_node
    if count not in (1, 2, 4) and (count < per_node or count % per_node):
      raise ValueError(f"--target={name!r}: {chip}-N counts GPUs: 1, 2 or 4 on one node, "
                       f"else whole nodes of {per_node} (e.g. {chip}-{per_node}, "
                       f"{chip}-{4 * per_node}).")
    if slices != 1:
      raise ValueError(f"--target_slices={slices}: slices are TPU multi-slice; a GPU "
                       f"target spans nodes by its count (e.g. {chip}-{2 * per_node}).")
    return GpuTarget(name, chip, count)
  match = _NAME.match(name.strip().lower())
  if not match:
    raise ValueError(f"--target={name!r}: expected cpu, a Cloud TPU slice name, e.g. "
                     f"v5p-8, v5e-16, v6e-256 or v4-8 (generations {sorted(GENERATIONS)}), "
                     f"or a number of GPUs, e.g. {', '.join(f'{c}-8' for c in GPUS)}.")
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
