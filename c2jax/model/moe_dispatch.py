"""MoE dispatch: run the chosen SwiGLU experts on their tokens and combine by gate weight.

Every implementation is a function
    dispatch(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *, quant='none')
        -> y_TxD
with y_t = sum_k weights[t, k] * expert_{indices[t, k]}(x_t) and
expert_e(x) = (silu(x W_gate[e]) * (x W_up[e])) W_down[e]; every expert matmul (forward
and both gradients) runs under the c2jax.quant recipe `quant` (cfg.quant).
  dense   every expert on every token (O(T*E*F) work): the reference; quantised through
          quant.dot per expert, which quantises exactly the operands the sorted
          dispatches quantise in the forward pass.
  ragged  sort token copies by expert, grouped matmuls through `lax.ragged_dot` (native
          on GPU/TPU; on CPU, where XLA has no grouped GEMM, a loop of row-tile
          matmuls with the same numerics, kernels/grouped_matmul/tiled.py).
  pallas  the same sort, grouped matmuls through the Pallas kernels of kernels/ (Mosaic
          GPU on GPUs, megablox on TPUs; on CPU megablox runs in Pallas' interpreter,
          which is slow and meant for tests). Mosaic GPU on hardware needs bfloat16
          compute (cfg.dtype) and D, F multiples of 64; it says so when they are not.
  gathered  each token copy gathers its expert's weights and runs a batched
          matrix-vector product: reads M expert weights, not E. For calls with few
          tokens (decode steps); `select` picks it there, whatever cfg.moe_impl says
          (and picks 'ragged' over 'dense' for every call against a KV cache).
Register a new one with `DISPATCH['name'] = fn`; config validation reads the keys.
  per_expert  (not a cfg.moe_impl: `select` picks it whenever the weights come split, one
          array per expert, as decode engines keep them: model.unstack_layers with
          split_experts=True) runs each chosen expert on every token for a few tokens,
          else sorts token copies by expert like the sorted dispatches and a static loop
          over experts runs each one's tiles of rows against its own weight arrays.
          XLA:CPU copies an expert's weights out of a stacked [E, D, F] array before a
          matmul reads them (static or dynamic index alike); separate arrays are read in
          place, and experts no token chose cost nothing.
  all_experts  (not a cfg.moe_impl either: the Experts module runs it for up to
          ALL_EXPERTS_MAX_TOKENS tokens when the weights come fused, model.unstack_layers
          with fuse_experts=True, as decode engines keep small experts) every expert on
          every token in three ops a layer, whatever E.

Products with the float32 gate weights and the sum over k happen in float32, as HF
does; the result is cast back to x's dtype. Under a block-scaled recipe the sorted
dispatches hand the tokens to the first two grouped GEMMs UNSORTED with their sort order
(`rows`), so the recipe quantises each token to MXFP8 once before the dispatch gather,
and expert outputs come back in bfloat16 for the combine (Composer 2's MoE recipe); the
dense reference rounds its expert outputs to bfloat16 the same way.

Einsum legend: T tokens, D hidden, E experts, F expert width, K experts per token,
M = T*K token copies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

import c2jax_kernels as kernels
from c2jax import quant as quantlib
from c2jax_kernels import weight_quant
from c2jax_kernels.grouped_matmul import IMPLS as GROUPED_MATMUL_IMPLS
from c2jax_kernels.grouped_matmul import tiled

# The Pallas kernel used where the platform's default grouped matmul is not Pallas (CPU):
# megablox has a CPU interpreter for every shape, Mosaic GPU needs 64-multiple features.
_PALLAS_FALLBACK_IMPL = "megablox"


# The Experts module's parameter holding fused gate and up weights [D, 2, E, F] (in place
# of 'gate_proj' and 'up_proj'): model.unstack_layers(..., fuse_experts=True); all_experts.
FUSED_GATE_UP = "gate_up_proj"


def fuse_gate_up(gate_ExDxF: jax.Array, up_ExDxF: jax.Array) -> jax.Array:
  """Stacked gate and up weights [E, D, F] as one FUSED_GATE_UP array [D, 2, E, F]."""
  return jnp.stack([gate_ExDxF.transpose(1, 0, 2), up_ExDxF.transpose(1, 0, 2)], axis=1)


def unfuse_gate_up(gate_up_Dx2xExF: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Inverse of fuse_gate_up: (gate [E, D, F], up [E, D, F])."""
  return (gate_up_Dx2xExF[:, 0].transpose(1, 0, 2), gate_up_Dx2xExF[:, 1].transpose(1, 0, 2))


class ExpertWeights(NamedTuple):
  gate_ExDxF: jax.Array
  up_ExDxF: jax.Array
  down_ExFxD: jax.Array


# Logical axis names of each stacked expert weight (the Experts module's parameters);
# expert parallelism reads them to gather the weights' sharded dimensions itself.
EXPERT_AXES = ExpertWeights(gate_ExDxF=("expert", "embed", "expert_mlp"),
                            up_ExDxF=("expert", "embed", "expert_mlp"),
                            down_ExFxD=("expert", "expert_mlp", "embed"))


def combine_dtype(quant: str, dtype) -> jnp.dtype:
  """Dtype of the expert outputs entering the combine: bfloat16 under block-scaled
  recipes (the report combines in BF16), the model dtype otherwise."""
  return jnp.dtype(dtype) if quant == "none" else jnp.dtype(jnp.bfloat16)


def dense(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *,
          quant: str = "none") -> jax.Array:
  """Every expert on every token, then a weighted sum (O(T*E*F) work): the reference."""
  num_experts = experts.gate_ExDxF.shape[0]
  # One quantised dot per expert: x is quantised along D per row, as in the grouped GEMM.
  expert_dot = functools.partial(quantlib.dot, quant)
  # x broadcast over experts makes each product a batched matmul that reads the weights
  # in place (an unbatched x lets XLA:CPU copy every expert's weights to [D, E*F] first).
  x_ExTxD = jnp.broadcast_to(x_TxD, (num_experts, *x_TxD.shape))
  gate_ExTxF = jax.vmap(expert_dot)(x_ExTxD, experts.gate_ExDxF)
  up_ExTxF = jax.vmap(expert_dot)(x_ExTxD, experts.up_ExDxF)
  down_dot = functools.partial(expert_dot,
                               preferred_element_type=combine_dtype(quant, x_TxD.dtype))
  out_ExTxD = jax.vmap(down_dot)(jax.nn.silu(gate_ExTxF) * up_ExTxF, experts.down_ExFxD)
  # Unchosen experts get weight 0; a replayed duplicate index adds its weights, as in HF.
  combine_TxE = jnp.einsum(
      "tk,tke->te", weights_TxK, jax.nn.one_hot(indices_TxK, num_experts, dtype=jnp.float32))
  y_TxD = jnp.einsum("etd,te->td", out_ExTxD.astype(jnp.float32), combine_TxE)
  return y_TxD.astype(x_TxD.dtype)


def sorted_by_expert(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *,
                     quant: str = "none", impl: str) -> jax.Array:
  """Sort token copies by expert, three grouped matmuls (kernels.grouped_matmul `impl`,
  under the quant recipe), unsort, combine."""
  num_experts = experts.gate_ExDxF.shape[0]
  order_M, rows_M, group_sizes_E = _sort_copies(indices_TxK, num_experts)
  out_MxD = grouped_experts(x_TxD, group_sizes_E, experts, quant=quant, impl=impl,
                            rows=rows_M)
  return _unsort_combine(out_MxD, order_M, weights_TxK, x_TxD.dtype)


def grouped_experts(x, group_sizes_E, experts: ExpertWeights, *, quant: str = "none",
                    impl: str, rows=None) -> jax.Array:
  """The three grouped matmuls of rows already grouped by expert (group_sizes_E rows of
  expert 0, then of expert 1, ...; rows past their sum come out zero): out_MxD in
  `combine_dtype`. rows: as for quant.grouped_dot (x is then [T, D], gathered per row)."""

  def grouped(lhs, rhs_ExCxN, rows=None, preferred_element_type=None):
    if weight_quant.is_quantized(rhs_ExCxN):
      # Weights resident quantised (an inference engine's engine.weights_quant): the
      # tile-at-a-time dequantising grouped matmul, under no training recipe.
      if quant != "none":
        raise ValueError(f"quant = {quant!r} (a training recipe) with quantised resident "
                         "expert weights: an engine runs them with quant = 'none'.")
      if rows is not None:
        lhs = jnp.take(lhs, rows, axis=0)
      return weight_quant.quantized_grouped_matmul(
          lhs, rhs_ExCxN, group_sizes_E, preferred_element_type=preferred_element_type)
    return quantlib.grouped_dot(quant, lhs, rhs_ExCxN, group_sizes_E, impl=impl, rows=rows,
                                preferred_element_type=preferred_element_type)

  gate_MxF = grouped(x, experts.gate_ExDxF, rows=rows)
  up_MxF = grouped(x, experts.up_ExDxF, rows=rows)
  return grouped(jax.nn.silu(gate_MxF) * up_MxF, experts.down_ExFxD,
                 preferred_element_type=combine_dtype(quant, x.dtype))


def grouped_impl(moe_impl: str, choice: str = "auto") -> str:
  """The grouped-matmul impl (kernels.grouped_matmul) for rows already grouped by expert
  under cfg.moe_impl: 'pallas' pallas_impl(choice=cfg.grouped_matmul_impl); the others
  `lax.ragged_dot`, as 'ragged' (every expert on every row, as 'dense' does, would be E
  times the work)."""
  return pallas_impl(choice=choice) if moe_impl == "pallas" else "ragged_dot"


def _sort_copies(indices_TxK, num_experts):
  """Token copies sorted by expert: (order_M, the token behind each sorted copy rows_M,
  group_sizes_E int32). The stable sort keeps each expert's tokens in token order."""
  top_k = indices_TxK.shape[1]
  expert_M = indices_TxK.reshape(-1)
  order_M = jnp.argsort(expert_M, stable=True)
  group_sizes_E = jax.nn.one_hot(expert_M, num_experts, dtype=jnp.int32).sum(0)
  return order_M, order_M // top_k, group_sizes_E


def _unsort_combine(out_MxD, order_M, weights_TxK, dtype):
  """Sorted expert outputs back in token order, summed by gate weight in float32."""
  num_tokens, top_k = weights_TxK.shape
  unsort_M = jnp.argsort(order_M)  # the inverse permutation
  out_TxKxD = jnp.take(out_MxD, unsort_M, axis=0).reshape(num_tokens, top_k, -1)
  y_TxD = jnp.einsum("tkd,tk->td", out_TxKxD.astype(jnp.float32), weights_TxK)
  return y_TxD.astype(dtype)


def ragged(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *,
           quant: str = "none") -> jax.Array:
  """Sort by expert; grouped matmuls through XLA's `lax.ragged_dot`."""
  return sorted_by_expert(x_TxD, weights_TxK, indices_TxK, experts, quant=quant,
                          impl="ragged_dot")


def gathered(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *,
             quant: str = "none") -> jax.Array:
  """Each token copy gathers its expert's weights ([M, D, F]: M expert weights read, not
  E) and multiplies them with its token: the cheapest dispatch when M <= E."""
  if quant != "none":
    raise ValueError(f"MoE dispatch 'gathered' runs unquantised experts; quant = {quant!r} "
                     "needs one of the sorted dispatches ('ragged', 'pallas') or 'dense'.")
  num_tokens, top_k = indices_TxK.shape
  expert_M = indices_TxK.reshape(-1)
  x_MxD = jnp.repeat(x_TxD, top_k, axis=0)
  gate_MxF = jnp.einsum("md,mdf->mf", x_MxD, experts.gate_ExDxF[expert_M])
  up_MxF = jnp.einsum("md,mdf->mf", x_MxD, experts.up_ExDxF[expert_M])
  out_MxD = jnp.einsum("mf,mfd->md", jax.nn.silu(gate_MxF) * up_MxF,
                       experts.down_ExFxD[expert_M])
  y_TxD = jnp.einsum("tkd,tk->td", out_MxD.reshape(num_tokens, top_k, -1).astype(jnp.float32),
                     weights_TxK)
  return y_TxD.astype(x_TxD.dtype)


# per_expert runs each chosen expert on every token up to this many tokens (decode steps
# up to batch 8); more as a loop over each expert's tiles of its own sorted rows.
ALL_TOKENS_MAX_TOKENS = 8
# Tokens up to which fused expert weights run all_experts (every expert on every token);
# a longer call (a prefill) gets the stacked weights back and the usual dispatch. At
# qwen3_moe_tiny's experts all_experts ran 1.12-1.39x faster than per_expert at 1 and 8
# tokens and 0.96-1.03x at 32 (2026-12-02, docs/benchmarks.md).
ALL_EXPERTS_MAX_TOKENS = 32


def all_experts(x_TxD, weights_TxK, indices_TxK, gate_up_Dx2xExF, down_ExFxD) -> jax.Array:
  """Every expert on every token from fused weights (model.unstack_layers(...,
  fuse_experts=True): gate and up of all experts as one [D, 2, E, F] array beside the
  stacked down projection [E, F, D]), unquantised: one product x [T, D] by [D, 2*E*F],
  the SwiGLU scaled by each token's combine weight (0 for an unchosen expert), and one
  product by down read as [E*F, D], which sums the weighted experts. Three ops a layer,
  whatever E, and the weights are read in place; E / K times the chosen experts' FLOPs.
  On CPU this beats reading only the chosen experts when a layer's experts are small
  (c2jax.rollout.cpu_decode.fused_experts_pay). Same result as the other dispatches up to
  float rounding: the combine weight multiplies before the down product, not after."""
  num_experts = gate_up_Dx2xExF.shape[2]
  h_Tx2xExF = jnp.einsum("td,dgef->tgef", x_TxD, gate_up_Dx2xExF,
                         preferred_element_type=jnp.float32)
  combine_TxE = jnp.einsum("tk,tke->te", weights_TxK,
                           jax.nn.one_hot(indices_TxK, num_experts, dtype=jnp.float32))
  h_TxExF = jax.nn.silu(h_Tx2xExF[:, 0]) * h_Tx2xExF[:, 1] * combine_TxE[:, :, None]
  y_TxD = jnp.einsum("tef,efd->td", h_TxExF.astype(x_TxD.dtype), down_ExFxD,
                     preferred_element_type=jnp.float32)
  return y_TxD.astype(x_TxD.dtype)


def is_split(experts: ExpertWeights) -> bool:
  """Whether `experts` holds one weight array per expert (tuples) rather than stacked ones."""
  return isinstance(experts.gate_ExDxF, (tuple, list))


def per_expert(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *,
               quant: str = "none") -> jax.Array:
  """Experts given as one array each (ExpertWeights of E-tuples of [D, F] / [F, D]), read
  in place. Up to ALL_TOKENS_MAX_TOKENS tokens: each chosen expert once, on every token,
  weighted by the combine weights (0 where a token did not choose it); an unchosen expert
  costs nothing. More: copies sorted by expert, then for each expert a loop over its
  tiles of sorted rows (none for an unchosen expert), each tile running the whole SwiGLU.
  Numerics as `ragged` (float32 accumulation, same combine)."""
  if quant != "none":
    raise ValueError(f"MoE dispatch 'per_expert' runs unquantised experts; quant = {quant!r} "
                     "needs the stacked expert weights (do not split them).")
  if not is_split(experts):
    raise ValueError("MoE dispatch 'per_expert' needs one weight array per expert (tuples, "
                     "model.unstack_layers(params, split_experts=True)); got stacked ones.")
  num_tokens, top_k = indices_TxK.shape
  num_experts = len(experts.gate_ExDxF)
  num_copies = num_tokens * top_k
  expert_M = indices_TxK.reshape(-1)
  out_dtype = combine_dtype(quant, x_TxD.dtype)

  def swiglu(x_RxD, e):
    h_RxF = (jax.nn.silu(jnp.dot(x_RxD, experts.gate_ExDxF[e],
                                 preferred_element_type=jnp.float32))
             * jnp.dot(x_RxD, experts.up_ExDxF[e], preferred_element_type=jnp.float32))
    return jnp.dot(h_RxF.astype(x_RxD.dtype), experts.down_ExFxD[e],
                   preferred_element_type=jnp.float32).astype(out_dtype)

  if num_tokens <= ALL_TOKENS_MAX_TOKENS:
    # Decode steps up to batch 8: reading an expert's weights costs more than its rows'
    # FLOPs here, so each chosen expert runs once on every token (measured 2026-11-26 at
    # small batch 8: 1.09x a switch per token copy, which read an expert once per copy,
    # and a tenth of its compile time; at batch 16 the sorted loop below is 1.2x faster).
    combine_TxE = jnp.einsum("tk,tke->te", weights_TxK,
                             jax.nn.one_hot(indices_TxK, num_experts, dtype=jnp.float32))
    chosen_E = jnp.bincount(expert_M, length=num_experts) > 0
    y_TxD = jnp.zeros(x_TxD.shape, jnp.float32)
    for e in range(num_experts):
      y_TxD = jax.lax.cond(
          chosen_E[e],
          lambda y, e=e: y + combine_TxE[:, e:e + 1] * swiglu(x_TxD, e).astype(jnp.float32),
          lambda y: y, y_TxD)
    return y_TxD.astype(x_TxD.dtype)

  order_M, rows_M, sizes_E = _sort_copies(indices_TxK, num_experts)
  x_MxD = jnp.take(x_TxD, rows_M, axis=0)  # token copies, sorted by expert
  starts_E = jnp.cumsum(sizes_E) - sizes_E
  tile = tiled.tile_rows(num_copies, num_experts)
  rows_R = jnp.arange(tile, dtype=jnp.int32)

  def expert_tiles(e, start, size, out_MxD):
    def body(w, out_MxD):
      # Rows of the tile's window (tiled.window) that are not this tile's keep what
      # they had.
      window, offset = tiled.window(start + w * tile, num_copies, tile)
      y_RxD = swiglu(jax.lax.dynamic_slice_in_dim(x_MxD, window, tile), e)
      mine_R = (rows_R >= offset) & (rows_R < offset + jnp.minimum(size - w * tile, tile))
      kept_RxD = jax.lax.dynamic_slice_in_dim(out_MxD, window, tile)
      return jax.lax.dynamic_update_slice_in_dim(
          out_MxD, jnp.where(mine_R[:, None], y_RxD, kept_RxD), window, 0)
    # The cond keeps an unchosen expert's work (and its weight reads) from running even
    # where XLA hoists a loop-invariant tile out of the loop (one tile: M <= tile).
    return jax.lax.cond(size > 0, lambda out: jax.lax.fori_loop(
        0, (size + tile - 1) // tile, body, out), lambda out: out, out_MxD)

  out_MxD = jnp.zeros((num_copies, x_TxD.shape[1]), out_dtype)
  for e in range(num_experts):
    out_MxD = expert_tiles(e, starts_E[e], sizes_E[e], out_MxD)
  return _unsort_combine(out_MxD, order_M, weights_TxK, x_TxD.dtype)


def is_quantized(experts: ExpertWeights) -> bool:
  """Whether any expert weight is held quantised (kernels.weight_quant.WeightQuant)."""
  return any(weight_quant.is_quantized(w) for w in experts)


def select(moe_impl: str, quant: str, num_tokens: int, top_k: int, num_experts: int, *,
           decoding: bool = False, split: bool = False,
           quantized: bool = False) -> Callable[..., jax.Array]:
  """The dispatch for one call: `moe_impl` (cfg.moe_impl), except that
  - weights held quantised (`quantized`: an engine's engine.weights_quant) always run
    'ragged', whose grouped matmuls dequantise a tile at a time and read only the chosen
    experts' weights (kernels.weight_quant);
  - weights split one array per expert (`split`, what decode engines keep) always run
    'per_expert', the one dispatch that reads them;
  - an unquantised call with no more token copies than experts (T * K <= E: decode steps,
    short prefills) runs 'gathered', which reads only the chosen experts' weights;
  - a `decoding` call (against a KV cache: decode steps and prefill chunks) never runs the
    'dense' reference, which computes all E experts for every token (E / K times the
    work): it runs the sorted 'ragged' dispatch, which computes only the chosen ones
    (same numerics up to float summation order). Training keeps `moe_impl` as given."""
  if quantized:
    return DISPATCH["ragged"]
  if split:
    return per_expert
  if quant == "none" and num_tokens * top_k <= num_experts:
    return DISPATCH["gathered"]
  if decoding and moe_impl == "dense":
    return DISPATCH["ragged"]
  return DISPATCH[moe_impl]


def pallas_impl(platform: str | None = None, choice: str = "auto") -> str:
  """The grouped-matmul impl behind moe_impl='pallas' on `platform` (default: the
  platform the step compiles for, kernels.target_platform()): `choice`
  (cfg.grouped_matmul_impl) where it names one, else the platform's default."""
  if choice != "auto":
    return choice
  platform = platform or kernels.target_platform()
  impl = kernels.default_grouped_matmul_impl(platform)
  if GROUPED_MATMUL_IMPLS[impl].is_pallas or platform != "cpu":
    return impl  # a GPU without a kernel of its generation (B200: 'tiled') keeps its default
  return _PALLAS_FALLBACK_IMPL  # CPU: the TPU kernel in interpret mode


def pallas(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *,
           quant: str = "none", impl: str | None = None) -> jax.Array:
  """Sort by expert; grouped matmuls through `impl`, default the platform's Pallas kernel
  (pallas_impl)."""
  return sorted_by_expert(x_TxD, weights_TxK, indices_TxK, experts, quant=quant,
                          impl=impl or pallas_impl())


def with_kernel(dispatch: Callable[..., jax.Array], choice: str) -> Callable[..., jax.Array]:
  """`dispatch`, with pallas_impl(choice=cfg.grouped_matmul_impl) bound when it is the
  'pallas' dispatch (the others choose no kernel)."""
  if dispatch is pallas:
    return functools.partial(pallas, impl=pallas_impl(choice=choice))
  return dispatch


DISPATCH: dict[str, Callable[..., jax.Array]] = {
    "dense": dense,
    "ragged": ragged,
    "pallas": pallas,
    "gathered": gathered,
}
