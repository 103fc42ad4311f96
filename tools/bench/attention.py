"""Benchmark: training attention kernels side by side (dense, blockwise, fused/cuDNN).

For MLA heads (q/k 192 = 128 nope + 64 rope, v 128; Kimi-K2.5's 64 heads per device at
TP 1) and GQA heads (64 query / 8 kv heads of 128), causal, with one document per row
('causal') and with packed documents ('documents', segment ids), times the forward and
forward+backward of each implementation c2jax.model.fused_attention can select, with
model FLOPs (causal: half the L x L scores), TFLOP/s, the speed over blockwise, and the
forward's max relative difference to the dense float32 reference. Also prints what
`attention_impl='auto'` would pick for each case on this device. bf16 operands.

  python -m tools.bench.attention [--length 4096] [--batch 1]
  python -m tools.bench.attention --smoke      # tiny, CPU, seconds

'fused' is jax.nn.dot_product_attention: cuDNN flash attention on a GPU, XLA's attention
elsewhere. 'tokamax' (where installed) is tokamax.dot_product_attention, the OpenXLA kernel
library's Mosaic flash attention on a GPU or TPU, its XLA attention on a CPU. A case the implementation cannot run (cuDNN refusing a shape) prints its error
in place of a time.
"""

import argparse
import datetime
import functools

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import attention
from c2jax.model import fused_attention as fused
from c2jax.model.blockwise_attention import blockwise_attention
from c2jax_kernels import platform
from tools.bench.grouped_matmul import print_table
from tools.bench.grouped_matmul import time_fn

# name -> (heads, kv heads, q/k head dim, v head dim)
HEADS = {"mla": (64, 64, 192, 128), "gqa": (64, 8, 128, 128)}
SMOKE_HEADS = {"mla": (2, 2, 24, 16), "gqa": (4, 2, 16, 16)}
IMPLS = ("dense", "blockwise", "fused") + (
    ("tokamax",) if platform.library_installed() else ())


def dense(q, k, v, segments, scale):
  """The reference: float32 scores over the full mask (attention.causal_mask)."""
  batch, length, heads, e = q.shape
  kv_heads = k.shape[2]
  q5 = q.reshape(batch, length, kv_heads, heads // kv_heads, e)
  scores = jnp.einsum("blkge,btke->bkglt", q5, k, preferred_element_type=jnp.float32) * scale
  mask = attention.causal_mask(length, segments, batch)[:, None]
  probs = attention.masked_softmax(scores, mask, q.dtype)
  out = jnp.einsum("bkglt,btkv->blkgv", probs, v)
  return out.reshape(batch, length, heads, v.shape[-1])


def blockwise(q, k, v, segments, scale, block):
  order = jnp.broadcast_to(jnp.arange(q.shape[1]), q.shape[:2])
  return blockwise_attention(q, k, v, order, order, segments, segments, scale=scale,
                             block=block)


def fused_call(q, k, v, segments, scale):
  mask = None if segments is None else fused.document_mask(segments, segments)
  return fused.fused_attention(q, k, v, mask, causal=True, scale=scale)


def tokamax_call(q, k, v, segments, scale):
  """tokamax.dot_product_attention with its Pallas kernel for this backend ('mosaic':
  Mosaic GPU flash attention on sm_90 / sm_100, Mosaic TPU), its XLA one on a CPU."""
  import tokamax  # pylint: disable=g-import-not-at-top
  impl = "xla" if jax.default_backend() == "cpu" else "mosaic"
  mask = None if segments is None else fused.document_mask(segments, segments)
  return tokamax.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=True,
                                       implementation=impl)


def packed_segments(batch, length, documents, seed=0):
  """[B, L] segment ids: `documents` contiguous documents of random lengths per row."""
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(batch):
    cuts = np.sort(rng.choice(np.arange(1, length), documents - 1, replace=False))
    rows.append(np.searchsorted(cuts, np.arange(length), side="right") + 1)
  return jnp.asarray(np.stack(rows), jnp.int32)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--length", type=int, default=4096)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--documents", type=int, default=8, help="per row, in 'documents'")
  parser.add_argument("--block", type=int, default=512, help="blockwise tile")
  parser.add_argument("--repeats", type=int, default=None)
  parser.add_argument("--heads", default="mla,gqa", help=f"from {sorted(HEADS)}")
  parser.add_argument("--masks", default="causal,documents", help="causal and/or documents")
  parser.add_argument("--smoke", action="store_true", help="tiny shapes, one repeat")
  args = parser.parse_args(argv)
  unknown = sorted(set(args.heads.split(",")) - set(HEADS))
  if unknown:
    raise SystemExit(f"--heads: unknown {unknown}; choose from {sorted(HEADS)}.")
  if set(args.masks.split(",")) - {"causal", "documents"}:
    raise SystemExit(f"--masks {args.masks}: use causal and/or documents.")
  heads_table = {name: (SMOKE_HEADS if args.smoke else HEADS)[name]
                 for name in args.heads.split(",")}
  length, batch = (32, 1) if args.smoke else (args.length, args.batch)
  block = 8 if args.smoke else args.block
  repeats = args.repeats or (1 if args.smoke else 10)
  device = jax.devices()[0]
  print(f"attention, {datetime.date.today()}, {device.platform} {device.device_kind}, "
        f"B={batch} L={length}, bf16, blockwise tile {block}, median of {repeats}")
  keys = jax.random.split(jax.random.key(0), 4)
  for name, (heads, kv_heads, e, v_dim) in heads_table.items():
    q = jax.random.normal(keys[0], (batch, length, heads, e), jnp.bfloat16)
    k = jax.random.normal(keys[1], (batch, length, kv_heads, e), jnp.bfloat16)
    v = jax.random.normal(keys[2], (batch, length, kv_heads, v_dim), jnp.bfloat16)
    dout = jax.random.normal(keys[3], (batch, length, heads, v_dim), jnp.bfloat16)
    scale = e ** -0.5
    flops = 2 * batch * heads * length * (length + 1) / 2 * (e + v_dim)
    for mask in args.masks.split(","):
      segments = None if mask == "causal" else packed_segments(batch, length, args.documents)
      fns = {"dense": functools.partial(dense, scale=scale),
             "blockwise": functools.partial(blockwise, scale=scale, block=block),
             "fused": functools.partial(fused_call, scale=scale),
             "tokamax": functools.partial(tokamax_call, scale=scale)}
      call = fused.AttentionCall(
          platform=device.platform, dtype="bfloat16", heads=heads, kv_heads=kv_heads,
          qk_head_dim=e, v_head_dim=v_dim, queries=length, keys=length, mask=mask,
          block=block, capability=fused._capability() if device.platform == "gpu" else None)
      choice = fused.select_attention("auto", call)
      reference = jax.jit(fns["dense"])(q, k, v, segments).astype(jnp.float32)
      rows, notes, base = [], [], {}
      for impl in IMPLS:
        fn = fns[impl]
        fwd = jax.jit(fn)
        bwd = jax.jit(lambda q, k, v, s, d, fn=fn: jax.vjp(lambda *x: fn(*x, s), q, k, v)[1](d))
        try:
          fwd_s = time_fn(fwd, q, k, v, segments, repeats=repeats)
          bwd_s = time_fn(bwd, q, k, v, segments, dout, repeats=repeats)
        except Exception as err:  # noqa: BLE001 -- a refused shape is a result here
          notes.append(f"{impl}: {type(err).__name__}: {str(err).splitlines()[0][:160]}")
          continue
        if impl == "blockwise":
          base = {"fwd": fwd_s, "bwd": bwd_s}
        rows.append((f"{impl} fwd", fwd_s, flops))
        rows.append((f"{impl} fwd+bwd", bwd_s, 3 * flops))
        got = fwd(q, k, v, segments).astype(jnp.float32)
        rel = jnp.max(jnp.abs(got - reference)) / jnp.max(jnp.abs(reference))
        notes.append(f"{impl}: forward vs dense, max |diff| / max |ref| = {float(rel):.2e}")
      if base:
        rows = [(n, s, f, base["fwd" if n.endswith(" fwd") else "bwd"]) for n, s, f in rows]
      ceiling = max(f / s for _, s, f, *_ in rows) / 1e12
      print_table(f"{name} heads {heads}/{kv_heads}, q/k {e}, v {v_dim}, mask {mask}; auto "
                  f"picks {choice.impl} ({choice.reason})", rows, ceiling,
                  baseline="blockwise" if base else None, ceiling_name="best")
      for note in notes:
        print(f"  {note}")


if __name__ == "__main__":
  main()
