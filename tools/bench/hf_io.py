"""Load and export of a generated ~2 GB HF checkpoint: wall time, GB/s, peak RSS.

  python -m tools.bench.hf_io --workdir runs/hfio_bench    # ~2 GB bf16
  python -m tools.bench.hf_io --workdir runs/hfio_smoke --smoke    # a few MB

Steps, each timed in its own process so its peak RSS (ru_maxrss) is its own:
  generate  a DeepSeek-V3-layout checkpoint (bf16, per-expert tensors, several shards,
            model.safetensors.index.json), written tensor by tensor;
  load      `init_from` = that directory through train/init_params.restore_init_params (the path
            every phase takes): detection, checks, shard-by-shard placement on the device;
            the loaded parameters are then saved as a c2jax run (orbax, not timed);
  export    `c2jax export`'s export_run of that run back to an HF directory.
On CPU the "device" is host memory, so the load's RSS necessarily includes the loaded
parameters; the figure that shows streaming is the peak above them (`rss_over_params`),
to be read next to the largest tensor. Everything generated is deleted at the end unless
--keep. Prints one JSON line per step and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

GB = 1e9
# ~1.0B parameters: 8 layers (1 dense), 40 experts of 1024 x 1024, vocabulary 32k.
FULL = dict(hidden_size=1024, num_hidden_layers=8, first_k_dense_replace=1,
            n_routed_experts=40, moe_intermediate_size=1024, intermediate_size=2816,
            vocab_size=32768, num_attention_heads=8)
SMOKE = dict(hidden_size=64, num_hidden_layers=3, first_k_dense_replace=1,
             n_routed_experts=4, moe_intermediate_size=32, intermediate_size=96,
             vocab_size=512, num_attention_heads=4)


def hf_config(size: dict) -> dict:
  return dict(
      model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], dtype="bfloat16",
      num_key_value_heads=size["num_attention_heads"], q_lora_rank=512 if size is FULL else 32,
      kv_lora_rank=256 if size is FULL else 16, qk_nope_head_dim=64 if size is FULL else 8,
      qk_rope_head_dim=32 if size is FULL else 8, v_head_dim=64 if size is FULL else 8,
      num_experts_per_tok=4, n_shared_experts=1, n_group=1, topk_group=1,
      norm_topk_prob=True, routed_scaling_factor=2.5, max_position_embeddings=4096,
      rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False,
      bos_token_id=0, eos_token_id=1, **size)


def _rss_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def generate(out: pathlib.Path, size: dict, shard_bytes: int) -> dict:
  from c2jax.hf import config as hf_config_lib
  from c2jax.hf import names, safetensors_io
  import ml_dtypes

  hf = hf_config(size)
  cfg, _ = hf_config_lib.from_hf(hf)
  block = (np.random.default_rng(0).standard_normal(1 << 20) * 0.02).astype(ml_dtypes.bfloat16)
  planned = []
  for leaf in names.leaves(cfg):
    for piece in leaf.pieces:
      shape = piece.hf_shape(leaf.slice_shape)
      planned.append(safetensors_io.PlannedTensor(
          piece.hf_name, block.dtype, shape, lambda shape=shape: np.resize(block, shape)))
  start = time.perf_counter()
  safetensors_io.write_sharded(out, planned, shard_bytes)
  (out / "config.json").write_text(json.dumps(hf, indent=2))
  seconds = time.perf_counter() - start
  total = sum(t.nbytes for t in planned)
  return {"step": "generate", "bytes": total, "seconds": seconds, "gb_per_s": total / GB / seconds,
          "tensors": len(planned), "shards": len(list(out.glob("*.safetensors"))),
          "largest_tensor_bytes": max(t.nbytes for t in planned), "peak_rss": _rss_bytes()}


def load(hf_dir: pathlib.Path, run: pathlib.Path) -> dict:
  import jax
  import ml_collections

  from c2jax import model
  from c2jax.hf import sources
  from c2jax.train import checkpoint as checkpoint_lib
  from c2jax.train import init_params
  from c2jax.train.step import TrainState

  cfg_model = sources.model_config(hf_dir)
  abstract = jax.eval_shape(lambda: model.init(cfg_model, jax.random.key(0)))
  leaves = jax.tree.leaves(abstract)
  params_bytes = sum(x.size * x.dtype.itemsize for x in leaves)
  before = _rss_bytes()
  start = time.perf_counter()
  cfg = ml_collections.ConfigDict({"init_from": str(hf_dir), "model": cfg_model})
  params = init_params.restore_init_params(cfg, abstract)
  jax.block_until_ready(params)
  seconds = time.perf_counter() - start
  peak = _rss_bytes()
  ckpt = checkpoint_lib.Checkpointer(run / "checkpoints", async_save=False)
  ckpt.save(1, TrainState(step=np.int32(1), params=params, opt_state=None), {},
            {"model": cfg_model.to_dict(), "init_from": str(hf_dir)}, force=True)
  ckpt.close()
  return {"step": "load", "bytes": params_bytes, "seconds": seconds,
          "gb_per_s": params_bytes / GB / seconds, "peak_rss": peak,
          "rss_before": before, "rss_over_params": peak - before - params_bytes,
          "largest_leaf_bytes": max(x.size * x.dtype.itemsize for x in leaves)}


def export(run: pathlib.Path, out: pathlib.Path, shard_bytes: int) -> dict:
  from c2jax.hf import export as export_lib

  before = _rss_bytes()
  start = time.perf_counter()
  summary = export_lib.export_run(run, out, max_shard_bytes=shard_bytes, log=lambda _: None)
  seconds = time.perf_counter() - start
  return {"step": "export", "bytes": summary["bytes"], "seconds": seconds,
          "gb_per_s": summary["bytes"] / GB / seconds, "peak_rss": _rss_bytes(),
          "rss_before": before, "shards": summary["shards"]}


def _child(step: str, args: list[str]) -> dict:
  done = subprocess.run([sys.executable, "-m", "tools.bench.hf_io", "--_step", step, *args],
                        capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise SystemExit(f"{step} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", type=pathlib.Path, required=True)
  parser.add_argument("--smoke", action="store_true", help="a few-MB model (the test)")
  parser.add_argument("--keep", action="store_true", help="keep the generated files")
  parser.add_argument("--_step", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  size = SMOKE if args.smoke else FULL
  shard_bytes = (256 * 1024) if args.smoke else 512 * 2**20
  hf_dir, run, out = (args.workdir / "hf", args.workdir / "run", args.workdir / "export")
  if args._step:  # one step, in this (child) process
    result = {"generate": lambda: generate(hf_dir, size, shard_bytes),
              "load": lambda: load(hf_dir, run),
              "export": lambda: export(run, out, shard_bytes)}[args._step]()
    print(json.dumps(result))
    return
  if args.workdir.exists() and any(args.workdir.iterdir()):
    raise SystemExit(f"--workdir {args.workdir} is not empty; pass a new directory.")
  flags = ["--workdir", str(args.workdir)] + (["--smoke"] if args.smoke else [])
  rows = []
  try:
    for step in ("generate", "load", "export"):
      rows.append(_child(step, flags))
      print(json.dumps(rows[-1]), flush=True)
  finally:
    if not args.keep:
      shutil.rmtree(args.workdir, ignore_errors=True)
  print("\n| step | checkpoint | wall s | GB/s | peak RSS | notes |\n|---|---|---|---|---|---|")
  for row in rows:
    note = {"generate": f"{row.get('shards')} shards, largest tensor "
                        f"{row.get('largest_tensor_bytes', 0) / 1e6:.1f} MB",
            "load": f"RSS over the loaded params {row.get('rss_over_params', 0) / 1e6:.0f} MB"
                    f"; largest leaf {row.get('largest_leaf_bytes', 0) / 1e6:.0f} MB",
            "export": f"{row.get('shards')} shards"}[row["step"]]
    print(f"| {row['step']} | {row['bytes'] / GB:.2f} GB | {row['seconds']:.1f} | "
          f"{row['gb_per_s']:.2f} | {row['peak_rss'] / GB:.2f} GB | {note} |")


if __name__ == "__main__":
  main()
