"""Compiled temp memory of the RL learner's log-prob loss + gradient: plain vs chunked.

    python -m tools.compile.logprob_memory --variant=small --length=8192 [--rows=1]
        [--attention_impl=blockwise --remat=full]

Lowers and compiles (never runs) value_and_grad of sum(log pi(token)) on abstract
parameters, and prints XLA's memory_analysis temp bytes for
  head_plain / head_chunked: the LM head alone (hidden [B, L, D] -> token log-probs),
  step_plain / step_chunked: the learner's whole forward + backward (c2jax.rl.learner.step),
plain = full float32 logits + log_softmax (the learner before chunking), chunked =
c2jax.model.token_logprobs with config.rl.logprobs' default chunks. With the model's
default dense attention the [H, L, L] scores dominate the whole step at long L; the
long-context settings (blockwise attention, full remat) show the head's share.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp

from c2jax import model
from c2jax.model import token_logprobs as tl
from c2jax.model import variants
from c2jax.rl import config as rl_config
from c2jax.rl.learner import step as learner


def _temp_bytes(fn, *args) -> int:
  return int(jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes)


def _plain_learner_logprobs(cfg, params, batch):
  """The learner's computation before chunking: logits [B, L, V] then log_softmax."""
  tokens = batch["tokens"]
  routing = jnp.transpose(batch["router_indices"], (2, 0, 1, 3))
  logits, aux, _ = model.apply(cfg, params, tokens, segment_ids_BxL=batch["valid"],
                               routing=routing)
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0], aux


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variant", default="small")
  parser.add_argument("--length", type=int, default=8192)
  parser.add_argument("--rows", type=int, default=1)
  parser.add_argument("--attention_impl", default=None, help="model.attention_impl")
  parser.add_argument("--remat", default=None, help="model.remat")
  args = parser.parse_args()
  overrides = {k: v for k, v in (("attention_impl", args.attention_impl),
                                 ("remat", args.remat)) if v is not None}
  cfg = variants.get(args.variant, **overrides)
  chunks = rl_config.default_config().logprobs
  rows, length, hidden, vocab = args.rows, args.length, cfg.hidden_size, cfg.vocab_size
  sds = jax.ShapeDtypeStruct
  h = sds((rows, length, hidden), jnp.dtype(cfg.dtype))
  w = sds((hidden, vocab), jnp.dtype(cfg.param_dtype))
  t = sds((rows, length), jnp.int32)
  grad2 = lambda f: jax.value_and_grad(f, argnums=(0, 1))
  result = dict(variant=args.variant, **overrides, length=length, rows=rows, vocab=vocab,
                seq_chunk=chunks.seq_chunk, vocab_chunk=chunks.vocab_chunk)
  result["head_plain"] = _temp_bytes(
      grad2(lambda a, b, c: tl.token_logprobs_reference(a, b, c).sum()), h, w, t)
  result["head_chunked"] = _temp_bytes(
      grad2(lambda a, b, c: tl.token_logprobs(a, b, c, seq_chunk=chunks.seq_chunk,
                                              vocab_chunk=chunks.vocab_chunk).sum()), h, w, t)
  params = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  num_moe = cfg.num_layers - cfg.first_k_dense
  batch = dict(tokens=t, valid=t,
               router_indices=sds((rows, length, num_moe, cfg.moe.num_experts_per_tok),
                                  jnp.int32))

  def step(score):
    return jax.value_and_grad(lambda p, b: score(p, b)[0].sum())

  result["step_plain"] = _temp_bytes(
      step(lambda p, b: _plain_learner_logprobs(cfg, p, b)), params, batch)
  result["step_chunked"] = _temp_bytes(
      step(lambda p, b: learner.token_logprobs(cfg, p, b, seq_chunk=chunks.seq_chunk,
                                               vocab_chunk=chunks.vocab_chunk)),
      params, batch)
  print(json.dumps(result))


if __name__ == "__main__":
  main()
