"""Which attention kernel a training / scoring forward runs, and the fused (cuDNN) call.

`config.model.attention_impl` names what the user asked for:
  'dense'      float32 [B, H, L, T] scores (the reference).
  'blockwise'  c2jax.model.blockwise_attention: flash-style jnp tiles, O(L) memory. The
               portable path (CPU, TPU, and GPU shapes cuDNN cannot express).
  'fused'      `jax.nn.dot_product_attention`: cuDNN flash attention on a GPU
               (`implementation='cudnn'`), XLA's own attention elsewhere (the same call,
               `implementation='xla'`, which is how it is tested on CPU).
  'tokamax'    tokamax.dot_product_attention (the field's kernel library, the `kernels`
               extra): its Mosaic flash attention on a GPU (sm_90 / sm_100) or a TPU, its
               XLA implementation on a CPU (how it is tested), with the same masks as
               'fused'. MLA's value head dim stays 128 (no padding). Opt-in: 'auto' never
               picks it (docs/kernels.md: not measured on a device yet).
  'auto'       `select_attention` picks one of dense, blockwise, fused per call from the
               platform, dtype, head shapes and mask kind: fused where cuDNN takes the
               call, else blockwise for long sequences and dense for a single tile.
With a KV cache, one-token decode steps always score densely; prefill chunks (L > 1) are
dispatched like training with the cache's position mask, an explicit 'fused' meaning
"cuDNN where it takes the shape" there (absorbed MLA heads are 576 wide).

How the masks reach cuDNN. This jax's public `dot_product_attention` has no segment-id
argument (its cuDNN backend has a packed, offsets-based layout, but only behind a private
module), so:
  one document per row (no segment ids)  `is_causal=True`, no mask tensor at all;
  packed documents (segment ids)         `is_causal=True` plus a boolean same-document mask
                                         [B, 1, L, T], which cuDNN reads as an additive bias
                                         of B * L * T elements: accepted while one row's
                                         bias stays under `MAX_MASK_ROW_BYTES`, blockwise
                                         beyond;
  context-parallel shards                the position mask [B, 1, S, T] (keys in any
                                         order), `is_causal=False`, same size rule.
MLA heads (q/k 192 = nope 128 + rope 64, v 128): the public call needs v's head dim to
equal q/k's, so v is zero-padded to 192 and the output sliced back to 128. The padded
columns add 50% to the P.V product only; softmax statistics are unchanged, so values and
gradients are exact.

Shape legend: B batch, L queries, T keys, H query heads, K kv heads, E q/k head dim,
V value head dim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

import c2jax_kernels as kernels
from c2jax_kernels import platform as kernel_platform

IMPLS = ("auto", "dense", "blockwise", "fused", "tokamax")
# The impls that take whole-sequence q, k, v with a boolean mask (fused_call runs them).
MASKED_CALL_IMPLS = ("fused", "tokamax")

# cuDNN flash attention (bf16/fp16) head-dim limits: <= 256 from Hopper (sm_90) on, <= 128
# before; a multiple of 8 either way. Ampere (sm_80) is the oldest GPU it runs on.
CUDNN_DTYPES = ("bfloat16", "float16")
MIN_CUDNN_CAPABILITY = (8, 0)

# One batch row's document mask as a cuDNN bias (2 bytes an element): 64 MiB is L = T =
# 5792, so packed rows of 4096 tokens go to cuDNN and rows of 8192 to blockwise.
MAX_MASK_ROW_BYTES = 64 * 2 ** 20


@dataclasses.dataclass(frozen=True)
class AttentionCall:
  """What the selector needs to know about one attention call (static shapes only)."""
  platform: str             # the target: 'cpu' | 'gpu' | 'tpu' (kernels.target_platform)
  dtype: str                # operand dtype name, e.g. 'bfloat16'
  heads: int
  kv_heads: int
  qk_head_dim: int
  v_head_dim: int
  queries: int              # L
  keys: int                 # T
  mask: str                 # 'causal' | 'documents' (segment ids) | 'positions' (CP)
  block: int = 512          # config.model.attention_block
  capability: tuple[int, int] | None = None   # GPU compute capability, e.g. (9, 0)


@dataclasses.dataclass(frozen=True)
class Choice:
  impl: str                 # 'fused' | 'blockwise' | 'dense'
  reason: str


def cudnn_refusal(call: AttentionCall) -> str | None:
  """Why cuDNN flash attention cannot take this call, or None when it can."""
  if call.platform != "gpu":
    return f"cuDNN needs a GPU; this backend is '{call.platform}'"
  if call.capability is not None and call.capability < MIN_CUDNN_CAPABILITY:
    major, minor = call.capability
    return f"cuDNN flash attention needs sm_80 or newer; this GPU is sm_{major}{minor}"
  if call.dtype not in CUDNN_DTYPES:
    return (f"cuDNN flash attention takes bfloat16/float16 operands; model.dtype is "
            f"{call.dtype}")
  hopper = call.capability is None or call.capability >= (9, 0)
  max_dim = 256 if hopper else 128
  if call.qk_head_dim > max_dim or call.qk_head_dim % 8:
    return (f"q/k head dim {call.qk_head_dim} is not a multiple of 8 at most {max_dim} "
            f"(cuDNN's limit on this GPU)")
  if call.v_head_dim > call.qk_head_dim:
    return (f"value head dim {call.v_head_dim} exceeds the q/k head dim "
            f"{call.qk_head_dim}; values are padded up to q/k's, never truncated")
  if call.heads % call.kv_heads:
    return f"{call.heads} query heads do not split over {call.kv_heads} kv heads"
  if call.mask != "causal":
    if call.queries % 2 or call.keys % 2:
      return (f"cuDNN trains with a mask bias only at even lengths; got {call.queries} "
              f"queries x {call.keys} keys")
    row_bytes = 2 * call.queries * call.keys
    if row_bytes > MAX_MASK_ROW_BYTES:
      return (f"the {call.mask} mask would be a {call.queries}x{call.keys} bias per row "
              f"({row_bytes / 2 ** 20:.0f} MiB > {MAX_MASK_ROW_BYTES / 2 ** 20:.0f} MiB)")
  return None


def select_attention(requested: str, call: AttentionCall, *, strict: bool = True) -> Choice:
  """The one place the attention kernel is chosen. Explicit names are honoured ('fused'
  raises on a GPU when cuDNN refuses the shape, rather than silently running something
  else, unless `strict` is False: then it falls back as 'auto' does); 'auto' falls back
  from cuDNN to blockwise / dense."""
  if requested not in IMPLS:
    raise ValueError(f"model.attention_impl = {requested!r}; choose one of {IMPLS}.")
  if requested in ("dense", "blockwise"):
    return Choice(requested, "asked for by model.attention_impl")
  if requested == "tokamax":
    return Choice("tokamax", f"asked for; tokamax's {_library_impl(call.platform)} "
                  "implementation")
  refusal = cudnn_refusal(call)
  if requested == "fused" and (strict or refusal is None or call.platform != "gpu"):
    if call.platform == "gpu" and refusal is not None:
      raise ValueError(
          f"model.attention_impl = 'fused' but cuDNN cannot run this call: {refusal}. Set "
          "model.attention_impl = 'auto' (falls back to blockwise) or change the shape.")
    return Choice("fused", "asked for; XLA implementation" if call.platform != "gpu"
                  else "asked for; cuDNN")
  if refusal is None:
    return Choice("fused", "cuDNN takes this call")
  if max(call.queries, call.keys) > call.block:
    return Choice("blockwise", refusal)
  return Choice("dense", f"{refusal}; one {call.block}-tile sequence, dense is cheapest")


def _capability() -> tuple[int, int] | None:
  device = kernels.target_device()  # the GPU the step compiles for, compile-only ones too
  text = getattr(device, "compute_capability", None)
  if not text:
    return None
  major, minor = str(text).split(".")[:2]
  return int(major), int(minor)


def choose(cfg, *, dtype, heads: int, kv_heads: int, qk_head_dim: int, v_head_dim: int,
           queries: int, keys: int, mask: str, strict: bool = True) -> str:
  """`select_attention(cfg.attention_impl, ...)` for the platform the step compiles for;
  shapes are static, so this runs once per trace."""
  platform = kernels.target_platform()
  call = AttentionCall(
      platform=platform, dtype=jnp.dtype(dtype).name, heads=heads, kv_heads=kv_heads,
      qk_head_dim=qk_head_dim, v_head_dim=v_head_dim, queries=queries, keys=keys, mask=mask,
      block=cfg.attention_block, capability=_capability() if platform == "gpu" else None)
  return select_attention(cfg.attention_impl, call, strict=strict).impl


def fused_attention(q_BxLxHxE: jax.Array, k_BxTxKxE: jax.Array, v_BxTxKxV: jax.Array,
                    mask_Bx1xLxT: jax.Array | None, *, causal: bool, scale: float,
                    implementation: str | None = None) -> jax.Array:
  """softmax(q k^T * scale, masked) v through `jax.nn.dot_product_attention`; [B, L, H, V]
  in q's dtype. `causal` applies j <= i by index (with T == L); `mask_Bx1xLxT` (bool,
  True = visible) adds any other visibility rule. `implementation` None picks 'cudnn' on
  a GPU and 'xla' elsewhere. Query head j*G + i reads kv head j (HF repeat_kv order)."""
  if implementation is None:
    implementation = "cudnn" if kernels.target_platform() == "gpu" else "xla"
  e, v_dim = q_BxLxHxE.shape[-1], v_BxTxKxV.shape[-1]
  if v_dim > e:
    raise ValueError(f"fused_attention: value head dim {v_dim} > q/k head dim {e}; use "
                     "blockwise attention for this shape.")
  if causal and q_BxLxHxE.shape[1] != k_BxTxKxE.shape[1]:
    raise ValueError("fused_attention: causal=True needs as many keys as queries; pass an "
                     "explicit mask for other layouts.")
  dtype = q_BxLxHxE.dtype
  v_BxTxKxE = jnp.pad(v_BxTxKxV.astype(dtype), ((0, 0), (0, 0), (0, 0), (0, e - v_dim)))
  out_BxLxHxE = jax.nn.dot_product_attention(
      q_BxLxHxE, k_BxTxKxE.astype(dtype), v_BxTxKxE, mask=mask_Bx1xLxT, scale=scale,
      is_causal=causal, implementation=implementation)
  return out_BxLxHxE[..., :v_dim]


def _library_impl(platform: str) -> str:
  return "xla" if platform == "cpu" else "mosaic"


def library_attention(q_BxLxHxE: jax.Array, k_BxTxKxE: jax.Array, v_BxTxKxV: jax.Array,
                      mask_Bx1xLxT: jax.Array | None, *, causal: bool,
                      scale: float) -> jax.Array:
  """fused_attention's contract through tokamax.dot_product_attention: [B, L, H, V] in
  q's dtype, V the value head dim as given (tokamax takes a value head dim unlike q/k's).
  Its Mosaic kernel on the target GPU or TPU, its XLA implementation on a CPU."""
  if causal and q_BxLxHxE.shape[1] != k_BxTxKxE.shape[1]:
    raise ValueError("library_attention: causal=True needs as many keys as queries; pass "
                     "an explicit mask for other layouts.")
  dtype = q_BxLxHxE.dtype
  return _library_call(q_BxLxHxE, k_BxTxKxE.astype(dtype), v_BxTxKxV.astype(dtype),
                       mask_Bx1xLxT, causal, scale)


@contextlib.contextmanager
def _on_target():
  """tokamax picks its kernel from JAX's default device and checks that it runs there;
  the program's target may be compile-only devices (`c2jax plan --target`), so both are
  set to the target, in the forward pass and again in the backward pass (traced later,
  outside the forward's context)."""
  tokamax = kernel_platform.library("model.attention_impl='tokamax'")
  cross = kernels.target_platform() != jax.default_backend()
  with jax.default_device(kernels.target_device()), tokamax.config.cross_compile(cross):
    yield tokamax


def _q_sharding():
  """q's NamedSharding by the logical rules in force ([batch, length, heads, head_dim]),
  for tokamax to run its Mosaic kernel per shard in a shard_map (XLA cannot partition a
  Mosaic call); axes already manual (inside context parallelism's shard_map) are left
  out. None off a mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return None
  manual = set(getattr(mesh, "manual_axes", ()))
  entries = []
  for entry in nn.logical_to_mesh_axes(("batch", "length", "heads", "head_dim")):
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    axes = tuple(a for a in axes if a not in manual and mesh.shape[a] > 1)
    entries.append(axes or None)
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*entries))


def _library_forward(q, k, v, mask, causal, scale):
  platform = kernels.target_platform()
  with _on_target() as tokamax:
    return tokamax.dot_product_attention(
        q, k, v, mask=mask, scale=scale, is_causal=causal,
        implementation=_library_impl(platform),
        q_sharding=None if platform == "cpu" else _q_sharding())


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _library_call(q, k, v, mask, causal, scale):
  return _library_forward(q, k, v, mask, causal, scale)


def _library_fwd(q, k, v, mask, causal, scale):
  out, pullback = jax.vjp(lambda q, k, v: _library_forward(q, k, v, mask, causal, scale),
                          q, k, v)
  return out, pullback


def _library_bwd(causal, scale, pullback, dout):
  del causal, scale
  with _on_target():
    dq, dk, dv = pullback(dout)
  return dq, dk, dv, None


_library_call.defvjp(_library_fwd, _library_bwd)


def masked_call(impl: str):
  """The whole-sequence attention call of one of MASKED_CALL_IMPLS."""
  return {"fused": fused_attention, "tokamax": library_attention}[impl]


def document_mask(q_segments_BxL: jax.Array, k_segments_BxT: jax.Array) -> jax.Array:
  """[B, 1, L, T] bool: same document (causality comes from `causal=True`)."""
  return (q_segments_BxL[:, :, None] == k_segments_BxT[:, None, :])[:, None]
