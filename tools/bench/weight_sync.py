"""Weight sync benchmark: publish + load time and bytes written per RL step.

  python -m tools.bench.weight_sync --model small --repeats 3

Publishes the model's freshly initialised parameters as a full snapshot, then steps in
which a fraction of the entries move by +-step_size (an Adam-like sign update; 1% of the
entries, then all of them), each as a delta against the previous publish. A subscriber
follows along incrementally. For each step: publish seconds (host arrays to manifest
written), load seconds (rebuild from the cached previous version), bytes written to the
directory, and that as a share of the raw parameter bytes. Loads are checked bit-exact.
Prints a markdown table (median over repeats).
"""

import argparse
import os
import pathlib
import statistics
import tempfile
import time

import jax
import numpy as np

from c2jax import model
from c2jax.model import variants
from c2jax.rollout import weights


def _bytes_written(root: pathlib.Path, version: int) -> int:
  arrays = root / "arrays" / f"{version:012d}"
  files = [arrays / d / f for d, _, names in os.walk(arrays) for f in names]
  manifest = root / "manifests" / f"{version:012d}.json"
  return sum(f.stat().st_size for f in files) + manifest.stat().st_size


def _perturb(flat: dict, fraction: float, step_size: float, rng) -> dict:
  out = {}
  for path, value in flat.items():
    moved = rng.random(value.shape) < fraction
    step = np.where(rng.random(value.shape) < 0.5, -step_size, step_size)
    out[path] = np.where(moved, value + step.astype(value.dtype), value).astype(value.dtype)
  return out


def _same_bits(got: dict, want: dict) -> bool:
  flat = weights.flatten(got)
  return all(flat[p].tobytes() == want[p].tobytes() for p in want)


def run(args, root: pathlib.Path) -> list[dict]:
  cfg = variants.get(args.model)
  params = jax.device_get(model.init(cfg, jax.random.key(0)))
  flat = {p: np.asarray(v).astype(args.dtype) for p, v in weights.flatten(params).items()}
  raw_bytes = sum(v.nbytes for v in flat.values())
  publisher = weights.WeightPublisher(root, full_every=10**6)
  subscriber = weights.WeightSubscriber(root)
  rng = np.random.default_rng(0)
  rows, version = [], 0
  plan = [("full snapshot", None)] + [(f"{f:.0%} of entries changed", f)
                                      for f in args.fractions]
  for label, fraction in plan:
    samples = {"publish_s": [], "load_s": [], "bytes": []}
    for _ in range(1 if fraction is None else args.repeats):
      if fraction is not None:
        flat = _perturb(flat, fraction, args.step_size, rng)
      version += 1
      t0 = time.perf_counter()
      manifest = publisher.publish(weights.unflatten(flat), version)
      samples["publish_s"].append(time.perf_counter() - t0)
      t0 = time.perf_counter()
      loaded = subscriber.load(version)
      samples["load_s"].append(time.perf_counter() - t0)
      assert _same_bits(loaded, flat), f"version {version} did not round-trip bit-exactly"
      samples["bytes"].append(_bytes_written(root, version))
    rows.append({"step": label, "kind": manifest["kind"],
                 **{k: statistics.median(v) for k, v in samples.items()},
                 "raw": raw_bytes})
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="small")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--fractions", type=float, nargs="+", default=[0.01, 1.0])
  parser.add_argument("--step_size", type=float, default=1e-5)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--dir", default=None, help="publish here (default: a temp dir)")
  args = parser.parse_args()
  if args.dtype == "bfloat16":
    args.dtype = jax.numpy.bfloat16
  if args.dir:
    rows = run(args, pathlib.Path(args.dir))
  else:
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as root:
      rows = run(args, pathlib.Path(root))
  print(f"model={args.model} dtype={np.dtype(args.dtype).name} "
        f"params={rows[0]['raw'] / 2**20:.1f} MiB raw, step_size={args.step_size}")
  print("| step | kind | publish s | load s | MiB written | % of raw |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['step']} | {r['kind']} | {r['publish_s']:.2f} | {r['load_s']:.2f} | "
          f"{r['bytes'] / 2**20:.2f} | {100 * r['bytes'] / r['raw']:.1f} |")


if __name__ == "__main__":
  main()
