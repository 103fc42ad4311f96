"""The peer side of tools/bench/decode_peers.py: one persistent worker process per
peer, run by that peer's own interpreter (its virtualenv; no c2jax needed, only the
standard library at the top):

    <peer python> tools/bench/decode_peer_workers.py {tunix,tunix_logprobs,maxtext,maxtext_sparse,hf}

It reads one JSON request a line on stdin ({"op": "build", "shape": ..., "batch": ...,
"prompt_len": ..., "new_tokens": ..., "hf_dir": ...}, then {"op": "time", "count": n} or
{"op": "split", "count": n}) and answers one JSON line each ({"params": ...};
{"seconds": ...}: the wall time of one whole generate call of n new tokens;
{"prefill": ..., "decode": ...}: the same call's prefill, which samples the first token,
and then its decode of the other n - 1 from the prefilled cache, timed apart). The
method and the settings of each peer are decode_peers.py's docstring.
"""

from __future__ import annotations

import json
import os
import sys
import time


class _IdTokenizer:
  """Tunix's sampler takes strings: a prompt is its token ids written out."""

  def encode(self, text, **_):
    return [int(t) for t in text.split()]

  def decode(self, ids, **_):
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self):
    return 0  # falsy: no BOS is prepended

  def eos_id(self):
    return -1

  def pad_id(self):
    return 0  # prompts are drawn from 1..vocab-1, and are never padded (16 = a power of 2)


def _tunix_builder(request: dict, logprobs: bool = False):
  import jax
  import numpy as np
  from flax import nnx
  from tunix.generate import sampler as sampler_lib
  from tunix.models.qwen3 import model as qwen3
  s = request["shape"]
  config = qwen3.ModelConfig(
      num_layers=s["layers"], vocab_size=s["vocab"], embed_dim=s["hidden"],
      hidden_dim=s["ffn"], num_heads=s["heads"], head_dim=s["head_dim"],
      num_kv_heads=s["kv_heads"], rope_theta=int(s["rope_theta"]), norm_eps=s["eps"],
      use_tied_embedding=False, num_experts=s["experts"], num_experts_per_tok=s["top_k"])
  transformer = qwen3.Qwen3(config, rngs=nnx.Rngs(0))
  params = sum(x.size for x in jax.tree.leaves(nnx.state(transformer, nnx.Param)))
  cache = sampler_lib.CacheConfig(
      cache_size=request["prompt_len"] + request["new_tokens"] + 8,
      num_layers=s["layers"], num_kv_heads=s["kv_heads"], head_dim=s["head_dim"])
  sampler = sampler_lib.Sampler(transformer, _IdTokenizer(), cache)
  rows = np.random.default_rng(0).integers(1, s["vocab"], (request["batch"],
                                                           request["prompt_len"]))
  prompts = [" ".join(map(str, row)) for row in rows]

  def timed(count):
    start = time.perf_counter()
    out = sampler(prompts, max_generation_steps=count,
                  max_prompt_length=request["prompt_len"], eos_tokens=[s["vocab"]],
                  temperature=0.0, return_logprobs=logprobs)
    jax.block_until_ready(out.tokens)
    return time.perf_counter() - start

  def split(count):
    # Sampler.__call__'s two device programs, timed apart: its prefill (which samples the
    # first token), then its decode loop from that cache. What __call__ does around them
    # (tokenizing, detokenizing the output) is left out on this side only.
    sampler.eos_ids = jax.numpy.array([s["vocab"]])
    start = time.perf_counter()
    state = sampler.init_sample_state(
        jax.numpy.asarray(rows), total_sampling_steps=request["prompt_len"] + count,
        include_logits=False, forbidden_token_ids=None, temperature=0.0, top_p=None,
        top_k=None, seed=jax.random.PRNGKey(0), beam_size=None, include_logprobs=logprobs)
    state = sampler._compiled_prefill_fn(  # pylint: disable=protected-access
        sampler._flattened_transformer_state, state, None, echo=False)  # pylint: disable=protected-access
    jax.block_until_ready(state.token_buffer)
    middle = time.perf_counter()
    state = sampler._compiled_decode_fn(  # pylint: disable=protected-access
        sampler._flattened_transformer_state, state)  # pylint: disable=protected-access
    jax.block_until_ready(state.token_buffer)
    return middle - start, time.perf_counter() - middle
  return timed, split, params


def _maxtext_builder(request: dict, sparse: bool):
  """MaxEngine at `request`'s DeepSeek-V3 shape, random weights, greedy: (timed, params)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  import maxtext
  from maxtext.configs import pyconfig
  from maxtext.inference.maxengine import maxengine
  tokens_class = maxengine.engine_api.ResultTokens
  if getattr(maxengine.engine_api, "_IS_STUB", False):  # no JetStream: make it a pytree
    jax.tree_util.register_pytree_node(
        tokens_class,
        lambda r: ((r.data, r.log_prob),
                   (r.tokens_idx, r.valid_idx, r.length_idx, r.samples_per_slot)),
        lambda aux, leaves: tokens_class(
            data=leaves[0], log_prob=leaves[1], tokens_idx=aux[0], valid_idx=aux[1],
            length_idx=aux[2], samples_per_slot=aux[3]))
  s, batch, prompt_len = request["shape"], request["batch"], request["prompt_len"]
  base = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
  overrides = dict(
      model_name="deepseek3-tiny", override_model_config="true", base_emb_dim=s["hidden"],
      base_num_query_heads=s["heads"], base_num_kv_heads=s["heads"],
      base_mlp_dim=s["dense_ffn"], base_moe_mlp_dim=s["ffn"],
      base_num_decoder_layers=s["layers"], first_num_dense_layers=s["first_dense"],
      vocab_size=s["vocab"], num_experts=s["experts"], num_experts_per_tok=s["top_k"],
      shared_experts=s["shared"], routed_scaling_factor=s["scaling"],
      q_lora_rank=s["q_lora"], kv_lora_rank=s["kv_lora"], qk_nope_head_dim=s["nope"],
      qk_rope_head_dim=s["rope"], v_head_dim=s["v"], rope_type="default",
      rope_max_timescale=int(s["rope_theta"]), normalization_layer_epsilon=s["eps"],
      scan_layers="false", sparse_matmul=str(sparse).lower(), megablox="false",
      mla_naive_kvcache="false", use_mla_absorbed_mqa="true", attention="dot_product",
      per_device_batch_size=batch, max_prefill_predict_length=prompt_len,
      max_target_length=prompt_len + request["new_tokens"] + 8, weight_dtype="float32",
      dtype="float32", decode_sampling_strategy="greedy", enable_checkpointing="false",
      skip_jax_distributed_system="true", run_name="bench_decode_peers")
  config = pyconfig.initialize(["maxengine", base, *(f"{k}={v}" for k, v in
                                                     overrides.items())])
  engine = maxengine.MaxEngine(config)
  weights = engine.load_params(rng=jax.random.PRNGKey(0))
  params = sum(x.size for x in jax.tree.leaves(weights))
  rows = jnp.asarray(np.random.default_rng(0).integers(1, s["vocab"], (batch, prompt_len)))
  rng = jax.random.PRNGKey(1)

  def split(count):
    start = time.perf_counter()
    state = engine.init_decode_state(rng)
    for slot in range(batch):
      prefix, sampled = engine.prefill(params=weights, padded_tokens=rows[slot],
                                       true_length=prompt_len, rng=rng, slot=slot)
      state = engine.insert(prefix, state, slot=slot)
    jax.block_until_ready((state, sampled.data))
    middle = time.perf_counter()
    for _ in range(count - 1):
      state, sampled = engine.generate(weights, state, rng=rng)
    jax.block_until_ready(sampled.data)
    return middle - start, time.perf_counter() - middle

  def timed(count):
    return sum(split(count))
  return timed, split, params


def hf_builder(request: dict):
  """transformers' greedy generate of `request['batch']` random prompts: (timed(count),
  None, parameter count); timed(count) is the seconds one generate of `count` tokens
  takes (there is no split timing on this side). decode.py's HF side uses it too."""
  import torch
  from transformers import AutoModelForCausalLM
  model = AutoModelForCausalLM.from_pretrained(request["hf_dir"], dtype=torch.float32).eval()
  params = sum(p.numel() for p in model.parameters())
  inputs = torch.randint(1, model.config.vocab_size,
                         (request["batch"], request["prompt_len"]),
                         generator=torch.Generator().manual_seed(0))

  def timed(count):
    start = time.perf_counter()
    with torch.no_grad():
      model.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=False,
                     max_new_tokens=count, min_new_tokens=count, use_cache=True,
                     pad_token_id=0)
    return time.perf_counter() - start
  return timed, None, params


def serve(peer: str) -> None:
  # Replies go to the pipe the driver reads; anything else written to stdout (a peer's
  # own prints, MaxText's config dump among them) goes to stderr instead.
  replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
  os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
  timed = split = None
  for line in sys.stdin:
    message = json.loads(line)
    if message["op"] == "build":
      timed, split, params = {"tunix": _tunix_builder, "hf": hf_builder,
                       "tunix_logprobs": lambda m: _tunix_builder(m, logprobs=True),
                       "maxtext": lambda m: _maxtext_builder(m, sparse=False),
                       "maxtext_sparse": lambda m: _maxtext_builder(m, sparse=True)}[peer](
                           message)
      reply = {"params": int(params), "split": split is not None}
    elif message["op"] == "split":
      prefill, decode = split(message["count"])
      reply = {"prefill": prefill, "decode": decode}
    else:
      reply = {"seconds": timed(message["count"])}
    replies.write(json.dumps(reply) + "\n")
    replies.flush()


if __name__ == "__main__":
  serve(sys.argv[1])
