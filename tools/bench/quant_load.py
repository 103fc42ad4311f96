"""Load (dequantise) and export (re-quantise) throughput and peak memory of released formats.

Writes a synthetic DeepseekV3 checkpoint in a released quantised layout (generated slice
by slice, never whole), then times, each in a fresh process so peak RSS is its own:
  load    `c2jax.hf.convert_from_hf` of the quantised directory (dequantise every tensor
          into the model dtype, stream it into a c2jax CKPT)
  export  `c2jax.hf.convert_to_hf(..., quantize=SCHEME)` of that CKPT back to the layout
and checks the export reproduces the loaded checkpoint byte for byte (the round trip).

  python -m tools.bench.quant_load --scheme fp8 --experts 32
  python -m tools.bench.quant_load --scheme int4 --experts 32

Sizes: hidden 1024, experts of 1024 x 512 (gate/up/down), --layers MoE layers after one
dense layer; --experts 32 --layers 4 is ~0.2 GB of fp8 (~0.4 GB dequantised, bf16).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

from c2jax.hf import config as hf_config
from c2jax.hf import convert, names, quantized, safetensors_io


def hf_dict(args) -> dict:
  return {
      "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
      "dtype": "bfloat16", "hidden_size": args.hidden, "intermediate_size": 2 * args.hidden,
      "moe_intermediate_size": args.moe, "n_routed_experts": args.experts,
      "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 1, "topk_group": 1,
      "first_k_dense_replace": 1, "num_hidden_layers": args.layers + 1,
      "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 256,
      "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
      "v_head_dim": 64, "vocab_size": 4096, "max_position_embeddings": 4096,
      "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu",
      "attention_bias": False, "tie_word_embeddings": False, "rope_interleave": True,
      "num_nextn_predict_layers": 0, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
      "scoring_func": "sigmoid", "topk_method": "noaux_tc"}


class RandomSource:
  """convert.Source whose slices are random bf16 weights made on demand, seeded by name."""

  def __init__(self, cfg):
    self.shapes = {leaf.path: leaf.shape for leaf in names.leaves(cfg)}

  def dtype(self, path):
    return np.dtype(ml_dtypes.bfloat16)

  def read(self, path, index):
    seed = int.from_bytes(hashlib.sha256(repr((path, index)).encode()).digest()[:8], "little")
    shape = self.shapes[path][len(index):]
    values = np.random.default_rng(seed).standard_normal(shape, np.float32) * 0.02
    return values.astype(ml_dtypes.bfloat16)


def make(args, root: pathlib.Path) -> pathlib.Path:
  cfg, _ = hf_config.from_hf(hf_dict(args))
  out = root / "released"
  convert.write_hf(RandomSource(cfg), cfg, out, 2**30, hf_dict(args), quantize=args.scheme)
  return out


def worker(kind: str, src: str, dst: str, scheme: str) -> None:
  base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  start = time.perf_counter()
  if kind == "load":
    summary = convert.convert_from_hf(src, dst)
  else:
    summary = convert.convert_to_hf(src, dst, quantize=scheme)
  seconds = time.perf_counter() - start
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  print(json.dumps({"seconds": seconds, "peak_rss_mb": peak / 1024,
                    "rss_before_mb": base / 1024, **summary}))


def size(path: pathlib.Path) -> int:
  return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scheme", default="fp8", choices=sorted(quantized.EXPORT_SCHEMES))
  parser.add_argument("--experts", type=int, default=32)
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--hidden", type=int, default=1024)
  parser.add_argument("--moe", type=int, default=512)
  parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(*args.worker)
    return
  with tempfile.TemporaryDirectory() as tmp:
    root = pathlib.Path(tmp)
    start = time.perf_counter()
    released = make(args, root)
    made = time.perf_counter() - start
    reader = safetensors_io.SafetensorsReader(released)
    largest = max(i.nbytes for i in reader.tensors.values())
    rows = {}
    for kind, src, dst in (("load", released, root / "ckpt"),
                           ("export", root / "ckpt", root / "again")):
      run = subprocess.run([sys.executable, "-m", "tools.bench.quant_load", "--worker", kind,
                            str(src), str(dst), args.scheme],
                           capture_output=True, text=True, check=True)
      rows[kind] = json.loads(run.stdout.strip().splitlines()[-1])
    again = safetensors_io.SafetensorsReader(root / "again")
    same = sorted(again.names()) == sorted(reader.names()) and all(
        again.read(n).tobytes() == reader.read(n).tobytes() for n in reader.names())
    stored, logical = size(released), rows["load"]["bytes"]
    print(f"{datetime.date.today()} scheme={args.scheme} stored {stored / 1e9:.3f} GB, "
          f"dequantised {logical / 1e9:.3f} GB (bf16), largest stored tensor "
          f"{largest / 1e6:.1f} MB; generated in {made:.1f} s")
    for kind, row in rows.items():
      print(f"  {kind:6s} {row['seconds']:6.1f} s  {stored / row['seconds'] / 1e9:.3f} GB/s "
            f"stored  peak RSS {row['peak_rss_mb']:.0f} MB (after imports "
            f"{row['rss_before_mb']:.0f} MB)")
    print(f"  export reproduces the released bytes: {same}")


if __name__ == "__main__":
  main()
