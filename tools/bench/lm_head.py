"""Benchmark: the LM-head loss (hidden @ W, softmax cross entropy) fused and unfused.

At Kimi-K2.5's vocabulary (163,840) the plain loss materialises float32 logits of
[tokens, vocab] (5.4 GB at 8,192 tokens) and, under autodiff, their softmax. Side by side,
forward+backward (gradients for the hidden states and the head's kernel) of the summed
cross entropy:
- 'unfused': full logits, optax softmax cross entropy (the loss with train.loss_vocab_chunk=0);
- 'c2jax chunked': c2jax.model.token_logprobs.vocab_chunked_nll (train.loss_vocab_chunk),
  vocabulary chunks with a custom VJP that writes each chunk's kernel gradient in place;
- 'c2jax token_logprobs': the RL learner's chunked log-probs (custom VJP, sequence and
  vocabulary chunks);
- 'tokamax <impl>': tokamax.linear_softmax_cross_entropy_loss, 'chunked_xla' everywhere and
  'mosaic_tpu' (its Pallas kernel) on a TPU, where tokamax is installed.
Per row: median ms of the jitted step, TFLOP/s (6 * tokens * hidden * vocab: the logits
and both gradients' matmuls), the compiled program's temporary buffers (XLA's memory
analysis), the speed over 'unfused', and the loss and gradients' relative error against
'unfused' in float32. bf16 operands.

  python -m tools.bench.lm_head [--tokens 8192] [--hidden 7168] [--vocab 163840]
  python -m tools.bench.lm_head --smoke      # tiny, CPU, seconds
  python -m tools.bench.lm_head --target v5p-8     # compiled for a TPU, no TPU needed
"""

import argparse
import datetime

import jax
import jax.numpy as jnp
import numpy as np
import optax

from c2jax.model import token_logprobs
from c2jax_kernels import platform
from tools.bench.grouped_matmul import time_fn

KIMI = dict(tokens=8192, hidden=7168, vocab=163840)
SMOKE = dict(tokens=256, hidden=64, vocab=1000)
VOCAB_CHUNK = 8192  # train.loss_vocab_chunk's default


def unfused(h, w, labels):
  logits = jnp.dot(h, w, preferred_element_type=jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum()


def c2jax_chunked(h, w, labels, vocab_chunk=VOCAB_CHUNK):
  return token_logprobs.vocab_chunked_nll(h[None], w, labels[None], vocab_chunk).sum()


def c2jax_token_logprobs(h, w, labels, vocab_chunk=VOCAB_CHUNK):
  return -token_logprobs.token_logprobs(h[None], w, labels[None],
                                        vocab_chunk=vocab_chunk).sum()


def tokamax_loss(impl):
  def loss(h, w, labels):
    import tokamax  # pylint: disable=g-import-not-at-top
    return tokamax.linear_softmax_cross_entropy_loss(h, labels, w, reduction='sum',
                                                     implementation=impl)
  return loss


def variants(smoke, backend):
  chunk = 256 if smoke else VOCAB_CHUNK
  rows = {'unfused': unfused,
          'c2jax chunked': lambda h, w, y: c2jax_chunked(h, w, y, chunk),
          'c2jax token_logprobs': lambda h, w, y: c2jax_token_logprobs(h, w, y, chunk)}
  if platform.library_installed():
    rows['tokamax chunked_xla'] = tokamax_loss('chunked_xla')
    if backend == 'tpu':
      rows['tokamax mosaic_tpu'] = tokamax_loss('mosaic_tpu')
  return rows


def compile_only(target, shape, smoke):
  """Each variant's step compiled for one compile-only device of `target` (a TPU slice
  through libtpu; a GPU in the gpu-compile venv): the compiled program's temporaries. (No
  time: the TPU compiler's estimate counts a loop's body once, so the chunked losses'
  estimates come out below the FLOPs' roofline.)"""
  import contextlib  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  from c2jax.plan import topologies  # pylint: disable=g-import-not-at-top
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  devices = topologies.parse_target(target).devices()
  mesh = jax.sharding.Mesh(np.asarray(devices[:1]), ('x',))
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  t, d, v = shape['tokens'], shape['hidden'], shape['vocab']
  args = (jax.ShapeDtypeStruct((t, d), jnp.bfloat16, sharding=rep),
          jax.ShapeDtypeStruct((d, v), jnp.bfloat16, sharding=rep),
          jax.ShapeDtypeStruct((t,), jnp.int32, sharding=rep))
  print(f"LM-head loss compiled for {target} ({devices[0].device_kind}), {datetime.date.today()}"
        f", tokens={t} hidden={d} vocab={v}, bf16 operands, forward+backward: the compiler's "
        "buffers")
  print(f"{'case':<24}{'temp GB':>10}")
  # tokamax checks the process's device unless told the program is for another machine.
  library = contextlib.nullcontext()
  if platform.library_installed():
    import tokamax  # pylint: disable=g-import-not-at-top
    library = tokamax.config.cross_compile(True)
  with jax.set_mesh(mesh), library:
    for name, fn in variants(smoke, devices[0].platform).items():
      try:
        compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(*args).compile()
      except Exception as error:  # pylint: disable=broad-except
        print(f"{name:<24} failed: {type(error).__name__}: {str(error)[:300]}", flush=True)
        continue
      print(f"{name:<24}{compiled.memory_analysis().temp_size_in_bytes / 1e9:>10.2f}",
            flush=True)


def rel_err(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--smoke', action='store_true', help='tiny shapes, one repeat')
  parser.add_argument('--tokens', type=int, default=None, help=f"default {KIMI['tokens']}")
  parser.add_argument('--hidden', type=int, default=None, help=f"default {KIMI['hidden']}")
  parser.add_argument('--vocab', type=int, default=None, help=f"default {KIMI['vocab']}")
  parser.add_argument('--repeats', type=int, default=None)
  parser.add_argument('--target', default='',
                      help="compile only, for a target ('v5p-8'; 'h100-8' in the gpu-compile "
                      'venv): temporaries and the compiler\'s estimate')
  args = parser.parse_args(argv)
  shape = dict(SMOKE if args.smoke else KIMI)
  shape.update({k: getattr(args, k) for k in KIMI if getattr(args, k)})
  if args.target:
    jax.config.update('jax_platforms', 'cpu')
    compile_only(args.target, shape, args.smoke)
    return
  repeats = args.repeats or (1 if args.smoke else 10)
  t, d, v = shape['tokens'], shape['hidden'], shape['vocab']
  keys = jax.random.split(jax.random.key(0), 3)
  h = jax.random.normal(keys[0], (t, d), jnp.bfloat16)
  w = (jax.random.normal(keys[1], (d, v)) / np.sqrt(d)).astype(jnp.bfloat16)
  labels = jax.random.randint(keys[2], (t,), 0, v)
  flops = 6 * t * d * v
  device = jax.devices()[0]
  print(f"LM-head loss, {datetime.date.today()}, {device.platform} {device.device_kind}, "
        f"tokens={t} hidden={d} vocab={v}, bf16 operands, forward+backward (d hidden, "
        f"d kernel), median of {repeats}")
  results, base = {}, None
  print(f"{'case':<24}{'ms':>10}{'TFLOP/s':>10}{'temp GB':>10}{'vs unfused':>12}"
        f"{'loss err':>11}{'dh err':>10}{'dW err':>10}")
  for name, fn in variants(args.smoke, jax.default_backend()).items():
    step = jax.jit(jax.value_and_grad(fn, argnums=(0, 1)))
    try:
      compiled = step.lower(h, w, labels).compile()
      memory = compiled.memory_analysis()
      temp = memory.temp_size_in_bytes / 1e9 if memory is not None else float('nan')
      seconds = time_fn(compiled, h, w, labels, repeats=repeats)
      loss, (dh, dw) = compiled(h, w, labels)
    except Exception as error:  # pylint: disable=broad-except
      print(f"{name:<24} failed: {type(error).__name__}: {str(error)[:300]}", flush=True)
      continue
    results[name] = (loss, dh, dw)
    base = base or seconds
    want = results['unfused'] if 'unfused' in results else (loss, dh, dw)
    errors = [rel_err(g, e) for g, e in zip((loss, dh, dw), want)]
    print(f"{name:<24}{seconds * 1e3:>10.3f}{flops / seconds / 1e12:>10.1f}{temp:>10.2f}"
          f"{base / seconds:>11.2f}x" + ''.join(f"{e:>10.1e}" for e in errors), flush=True)


if __name__ == '__main__':
  main()
