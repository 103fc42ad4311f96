"""The LM head's cross entropy fused with its matmul, through tokamax (the `kernels` extra).

    nll_T = linear_cross_entropy(x_TxD, kernel_DxV, labels_T)

is -log softmax(x @ kernel)[label] per row, float32, without a [T, V] logits array, by
tokamax's `linear_softmax_cross_entropy_loss` with the implementation chosen for the
target platform:
  tpu: 'mosaic_tpu', its Pallas kernel (0.47 GB of temporaries for 8,192 tokens at
       Kimi-K2.5's 163,840-token vocabulary on v5p, against 5.37 GB for full logits;
       docs/kernels.md). It reads past its operands unless the vocabulary is a multiple
       of 128 and the rows of 1,024 (seen in Pallas' TPU interpreter): rows are padded
       here, and another vocabulary is refused.
  gpu: 'chunked_xla', its blocked XLA loop. It counts the padding of a vocabulary that
       is no multiple of its 2,048-column block in the softmax (DeepSeek-V3's 129,280):
       such a vocabulary is refused.
  cpu: 'xla', the plain computation (full logits), for tests.
The gradients (for x and the kernel) are tokamax's; they come back in the operands'
dtypes. Legend: T rows (tokens), D hidden, V vocabulary.
"""

import contextlib
import functools

import jax
import jax.numpy as jnp

from c2jax_kernels import platform as platform_lib

IMPLEMENTATION_BY_PLATFORM = {'tpu': 'mosaic_tpu', 'gpu': 'chunked_xla', 'cpu': 'xla'}
_TPU_VOCAB_MULTIPLE = 128  # lanes
_TPU_ROW_MULTIPLE = 1024   # its smallest row block: 8 sublanes x 128 lanes
_GPU_VOCAB_MULTIPLE = 2048  # chunked_xla's column block


def _tokamax():
  return platform_lib.library("The LM-head loss train.loss_impl='tokamax'")


def check_vocab(vocab: int, platform: str) -> None:
  """Raises ValueError when tokamax's kernel for `platform` would be wrong at `vocab`."""
  need = {'mosaic_tpu': _TPU_VOCAB_MULTIPLE, 'chunked_xla': _GPU_VOCAB_MULTIPLE}.get(
      IMPLEMENTATION_BY_PLATFORM.get(platform))
  if need and vocab % need:
    raise ValueError(
        f"The tokamax LM-head loss on {platform} needs a vocabulary that is a multiple of "
        f"{need}; model.vocab_size is {vocab}. Pad the vocabulary (model.vocab_size, the "
        f"embedding and head grow; the tokenizer is unchanged) or use train.loss_impl="
        f"'c2jax'.")


def linear_cross_entropy(x_TxD, kernel_DxV, labels_T):
  """float32 [T]: -log softmax(x @ kernel)[label] per row (see the module docstring)."""
  platform = platform_lib.target_platform()
  if platform not in IMPLEMENTATION_BY_PLATFORM:
    raise ValueError(f"The tokamax LM-head loss has no implementation for {platform!r} "
                     f"(only {sorted(IMPLEMENTATION_BY_PLATFORM)}); use "
                     "train.loss_impl='c2jax'.")
  impl = IMPLEMENTATION_BY_PLATFORM[platform]
  _tokamax()  # the clear error when it is missing
  rows, vocab = x_TxD.shape[0], kernel_DxV.shape[1]
  check_vocab(vocab, platform)
  kernel_DxV = kernel_DxV.astype(x_TxD.dtype)
  pad = -rows % _TPU_ROW_MULTIPLE if impl == 'mosaic_tpu' else 0
  if pad:  # zero rows: they add nothing to either gradient and are cut from the output
    x_TxD = jnp.pad(x_TxD, ((0, pad), (0, 0)))
    labels_T = jnp.pad(labels_T, (0, pad))
  return _cast_cotangents(x_TxD, kernel_DxV, labels_T, impl)[:rows]


def _for_target(impl):
  """tokamax checks the process's device before a Mosaic kernel, forward and backward;
  the program's target may be another machine's (c2jax plan --target)."""
  if impl == 'mosaic_tpu':
    return _tokamax().config.cross_compile(True)
  return contextlib.nullcontext()


def _loss(x_TxD, kernel_DxV, labels_T, impl):
  with _for_target(impl):
    return _tokamax().linear_softmax_cross_entropy_loss(
        x_TxD, labels_T, kernel_DxV, reduction='none', implementation=impl).astype(
            jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _cast_cotangents(x_TxD, kernel_DxV, labels_T, impl):
  """_loss, whose gradients come back in the operands' dtypes (tokamax's TPU kernel
  returns float32 ones for bfloat16 operands, which the model's backward pass would
  otherwise carry on in float32)."""
  return _loss(x_TxD, kernel_DxV, labels_T, impl)


def _cast_fwd(x_TxD, kernel_DxV, labels_T, impl):
  nll_T, pullback = jax.vjp(lambda x, k: _loss(x, k, labels_T, impl), x_TxD, kernel_DxV)
  dtypes = (jnp.zeros((), x_TxD.dtype), jnp.zeros((), kernel_DxV.dtype))
  return nll_T, (pullback, dtypes)


def _cast_bwd(impl, residuals, dnll_T):
  pullback, (x_dtype, kernel_dtype) = residuals
  with _for_target(impl):
    dx_TxD, dkernel_DxV = pullback(dnll_T)
  return dx_TxD.astype(x_dtype.dtype), dkernel_DxV.astype(kernel_dtype.dtype), None


_cast_cotangents.defvjp(_cast_fwd, _cast_bwd)
