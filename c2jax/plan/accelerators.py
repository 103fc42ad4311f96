"""Published peak rates of the accelerators c2jax plans for: the one table rooflines use.

Dense (no structured sparsity) tensor-core peaks per device, from the vendors' datasheets:
NVIDIA H100 SXM5 and H200 SXM (Hopper), HGX B200 and HGX B300 (Blackwell, per GPU), and
Google Cloud TPU v4, v5e, v5p and v6e (per chip, Cloud TPU documentation). `link_gb_s` is
the scale-up interconnect bandwidth per device and direction (NVLink 4: 900 GB/s total ->
450; NVLink 5: 1.8 TB/s -> 900; TPU v5p ICI 4,800 Gbps total -> 300; v5e 400 GB/s
bidirectional -> 200; v6e 800 GB/s -> 400; v4, whose page gives no per-chip figure, at
v5e's per-link rate over its 6 links, an estimate): the bound a collective cannot beat
inside a node or slice. The TPUs' int8 peaks are not FP8 matmul peaks, so FP8 is None.

`measure_cpu()` adds this machine, whose peaks are measured (a large float32 matmul and a
large array copy), so a roofline can be checked against a measured step where it runs.
"""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass(frozen=True)
class Accelerator:
  name: str
  bf16_tflops: float  # dense peak of the compute dtype the step uses
  fp8_tflops: float | None
  hbm_tb_s: float
  memory_gb: float
  link_gb_s: float  # per device, per direction

  def peak_flops(self, dtype: str) -> float:
    if dtype in ("float8", "mxfp8", "fp8"):
      if self.fp8_tflops is None:
        raise ValueError(f"{self.name} has no FP8 matmul peak; plan it in bfloat16.")
      return self.fp8_tflops * 1e12
    return self.bf16_tflops * 1e12


ACCELERATORS: dict[str, Accelerator] = {
    "h100": Accelerator("H100 SXM", 989.4, 1978.9, 3.35, 80, 450),
    "h200": Accelerator("H200 SXM", 989.4, 1978.9, 4.8, 141, 450),
    "b200": Accelerator("B200", 2250.0, 4500.0, 8.0, 180, 900),
    "b300": Accelerator("B300", 2250.0, 4500.0, 8.0, 288, 900),
    "tpu_v4": Accelerator("TPU v4", 275.0, None, 1.2, 34.4, 150),  # 32 GiB
    "tpu_v5e": Accelerator("TPU v5e", 197.0, None, 0.819, 16, 200),
    "tpu_v5p": Accelerator("TPU v5p", 459.0, None, 2.765, 95, 300),
    "tpu_v6e": Accelerator("TPU v6e", 918.0, None, 1.638, 32, 400),
}


def by_device_kind(device_kind: str) -> Accelerator | None:
  """The table row of a jax `device.device_kind` ('NVIDIA H100 80GB HBM3' -> H100 SXM,
  'TPU v5p' -> TPU v5p), or None for a device the table lacks (e.g. a CPU). PCIe parts
  map to their SXM row, whose peaks are higher: a bound, never an excuse."""
  kind = device_kind.lower().replace("-", " ")
  for key, acc in ACCELERATORS.items():
    if key.replace("_", " ") in kind:
      return acc
  return None


def _best_seconds(fn, repeats: int) -> float:
  fn()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def matmul_ceiling(dtype=None, n: int = 2048, repeats: int = 5) -> float:
  """FLOP/s of the best of `repeats` jitted n x n x n matmuls on the default device
  (float32 on CPU, bfloat16 on accelerators unless `dtype` is given)."""
  import jax
  import jax.numpy as jnp

  if dtype is None:
    dtype = jnp.float32 if jax.devices()[0].platform == "cpu" else jnp.bfloat16
  a = jnp.ones((n, n), dtype)
  matmul = jax.jit(lambda x, y: x @ y)
  return 2 * n**3 / _best_seconds(lambda: matmul(a, a).block_until_ready(), repeats)


def copy_bandwidth(num_bytes: int = 256 << 20, repeats: int = 5) -> float:
  """Bytes/s of a jitted elementwise pass over a large float32 array (read + write)."""
  import jax
  import jax.numpy as jnp

  x = jnp.ones((num_bytes // 4,), jnp.float32)
  bump = jax.jit(lambda v: v + 1.0)
  return 2 * num_bytes / _best_seconds(lambda: bump(x).block_until_ready(), repeats)


def measure_cpu() -> Accelerator:
  """This machine's devices as an Accelerator with measured peaks (compute in float32)."""
  import jax

  flops = matmul_ceiling()
  return Accelerator(f"this {jax.devices()[0].platform} (measured)", flops / 1e12, None,
                     copy_bandwidth() / 1e12, 0.0, float("inf"))
