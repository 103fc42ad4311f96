"""A one-token GQA attention step over a KV cache, two ways, side by side on this backend:
`dot` (two einsums, as training and prefill compute attention) and `stream` (the decode
step's multiply-and-sum over the cache as it lies; c2jax/model/attention.py `_gqa_step`).

    PYTHONPATH=. python tools/bench/bench_decode_attention.py
    PYTHONPATH=. python tools/bench/bench_decode_attention.py --shapes 8x4168x4x2x64 --calls 20

A shape is BxTxKxGxE: batch, cache slots, KV heads, query heads per KV head, head width.
The cache is [B, T, K, E], the engine's layout. Each form is one jitted call; the two
alternate for --rounds rounds of --calls calls and the best round counts. Both forms are
checked to agree before timing.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import attention

# qwen3_tiny and qwen3_small (bench_decode_peers.py) at a 16-token prompt + 64 new + 8,
# and qwen3_small at 4,096 prompt tokens.
DEFAULT_SHAPES = ("1x88x2x2x16", "8x88x2x2x16", "32x88x2x2x16", "1x88x4x2x64", "8x88x4x2x64",
                  "32x88x4x2x64", "1x4168x4x2x64", "8x4168x4x2x64")


def dot_form(q_BxKxGxE, keys_BxTxKxE, values_BxTxKxE, mask_BxT):
  """The einsum form (`attention._gqa_attend` before one-token steps had their own)."""
  e = q_BxKxGxE.shape[-1]
  scores = jnp.einsum("bkge,btke->bkgt", q_BxKxGxE, keys_BxTxKxE,
                      preferred_element_type=jnp.float32) * e ** -0.5
  scores = jnp.where(mask_BxT[:, None, None], scores, jnp.finfo(jnp.float32).min)
  return jnp.einsum("bkgt,btke->bkge", jax.nn.softmax(scores, axis=-1), values_BxTxKxE)


def stream_form(q_BxKxGxE, keys_BxTxKxE, values_BxTxKxE, mask_BxT):
  return attention._gqa_step(q_BxKxGxE, keys_BxTxKxE, values_BxTxKxE, mask_BxT,  # pylint: disable=protected-access
                             jnp.float32)


def measure(shape: str, rounds: int, calls: int) -> dict:
  b, t, k, g, e = map(int, shape.split("x"))
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((b, k, g, e)), jnp.float32)
  keys, values = (jnp.asarray(rng.standard_normal((b, t, k, e)), jnp.float32) for _ in "kv")
  mask = jnp.asarray(np.arange(t)[None, :] < rng.integers(1, t + 1, (b, 1)))
  forms = {"dot": jax.jit(dot_form), "stream": jax.jit(stream_form)}
  outs = [f(q, keys, values, mask) for f in forms.values()]
  np.testing.assert_allclose(*outs, rtol=1e-4, atol=1e-5)
  best = {name: float("inf") for name in forms}
  for _ in range(rounds):
    for name, f in forms.items():
      start = time.perf_counter()
      for _ in range(calls):
        out = f(q, keys, values, mask)
      out.block_until_ready()
      best[name] = min(best[name], (time.perf_counter() - start) / calls)
  return {"shape": shape, "dot_us": best["dot"] * 1e6, "stream_us": best["stream"] * 1e6,
          "dot / stream": best["dot"] / best["stream"]}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES))
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--calls", type=int, default=100)
  args = parser.parse_args(argv)
  print(f"one-token attention, {jax.default_backend()}, jax {jax.__version__}")
  print(f"{'BxTxKxGxE':>16} {'dot us':>10} {'stream us':>10} {'dot/stream':>10}")
  for shape in args.shapes.split(","):
    row = measure(shape, args.rounds, args.calls)
    print(f"{row['shape']:>16} {row['dot_us']:10.1f} {row['stream_us']:10.1f} "
          f"{row['dot / stream']:10.2f}", flush=True)


if __name__ == "__main__":
  main()
