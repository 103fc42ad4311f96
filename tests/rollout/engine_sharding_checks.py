"""The JaxEngine on 8 fake CPU devices against one device, run as a subprocess by
test_engine_sharding (XLA_FLAGS must be set before jax is imported).

    python tests/rollout/engine_sharding_checks.py plain|speculative  -> one JSON line

For each mesh, the same requests (greedy and seeded sampling, prompts of several
lengths, more requests than slots) run on a one-device engine and on a sharded one,
with an in-flight weight update staged at the same step on both (host arrays for one
run, arrays sharded some other way for the next). The test file asserts on the printed
token / log-prob / routing differences and the shardings seen after each step.
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # XLA's SPMD warnings on tiny shapes

import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from c2jax import parallel  # noqa: E402
from c2jax.model import mtp  # noqa: E402
from c2jax.model import variants  # noqa: E402
from c2jax.rollout import JaxEngine, Request, SamplingParams  # noqa: E402
from tests.model.conftest import MLA_OVERRIDES, draw_params, random_params, tiny_cfg  # noqa: E402

VOCAB, SLOTS, MAX_LENGTH, BUCKETS = 16, 8, 48, (16,)
MESHES = {"fsdp8": dict(fsdp=8), "data2_expert4": dict(data=2, expert=4)}
SPECULATIVE_MESH = "fsdp4_tensor2", dict(fsdp=4, tensor=2)
SWAP_AT = 3  # engine steps before the staged update is installed
# Tokens per decode call: small enough that a generation of 10 tokens spans several
# calls, so the swap after SWAP_AT steps lands mid-generation on every engine (with the
# default of up to 64, every request would finish in one call, before the swap).
DECODE_STEPS = 2


def parallel_cfg(**sizes):
  par = parallel.default_parallel_config()
  par.mesh.update({"data": 1, "fsdp": 1, "expert": 1, "context": 1, "tensor": 1, **sizes})
  return par


def make_model():
  """ENGINE_MODEL=small (by hand; too slow for the suite): the `small` variant (8 layers,
  16 experts, vocabulary 16384; random weights, no MTP layer) in place of the test model."""
  if os.environ.get("ENGINE_MODEL", "test") == "small":
    cfg = variants.get("small", init_std=0.05)
    params = random_params(cfg)
    return cfg, params, jax.tree.map(lambda x: x * 1.05, params)
  # One MoE layer (MLA attention, router, routed + shared experts) and the MTP layer, in
  # place of a dense + MoE pair: compiled for one engine and three meshes.
  cfg = tiny_cfg(vocab_size=VOCAB, num_layers=1, first_k_dense=0, num_mtp_layers=1,
                 **MLA_OVERRIDES)
  params = random_params(cfg)
  params[mtp.PARAMS_KEY] = draw_params(
      jax.eval_shape(lambda: mtp.init(cfg, jax.random.key(1))), cfg.init_std, 8)
  updated = jax.tree.map(lambda x: x * 1.05, params)
  return cfg, params, updated


def requests():
  """12 requests for 8 slots (queueing + slot reuse): greedy, then seeded sampling with
  temperature, top-k and top-p; prompt lengths 1..21 (prefill over two chunks)."""
  rng = np.random.default_rng(0)
  out = []
  for i in range(12):
    prompt = rng.integers(1, VOCAB, size=1 + (5 * i) % 22).tolist()
    if i % 3 == 0:
      sampling = SamplingParams(temperature=0.0, max_tokens=10)
    else:
      sampling = SamplingParams(temperature=0.9, top_k=(0, 6)[i % 2], top_p=(1.0, 0.85)[i % 3 == 2],
                                max_tokens=10, seed=100 + i)
    out.append(Request(prompt, sampling))
  return out


def run(engine, swap_params, swap_version=1):
  """Steps every request to completion, staging `swap_params` after SWAP_AT steps;
  returns the generations by seq id and the shardings seen after every step."""
  ids = [engine.submit(r) for r in requests()]
  results, steps, layouts = {}, 0, set()
  param_shardings = engine.placement and engine.placement.param_shardings(engine.cfg,
                                                                          engine._params)
  while len(results) < len(ids):
    if steps == SWAP_AT:
      engine.update_params(swap_params, swap_version)
    for g in engine.step():
      results[g.seq_id] = g
    steps += 1
    layouts.add(layout(engine, param_shardings))
  return [results[i] for i in ids], sorted(layouts)


def layout(engine, param_shardings):
  """Whether params and decode state still have the placement's shardings (a summary);
  `param_shardings`: placement.param_shardings of the engine's parameters, derived once
  a run (each derivation traces the model's init, and this runs after every step)."""
  if engine.placement is None:
    return "single"
  placement, cfg = engine.placement, engine.cfg

  def same(tree, shardings):
    return all(a.sharding.is_equivalent_to(s, a.ndim)
               for a, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))

  params_ok = same(engine._params, param_shardings)
  cache_ok = same(engine._cache, placement.cache_shardings(cfg))
  if engine._num_draft:
    cache_ok = (cache_ok and same(engine._mtp_cache, placement.mtp_cache_shardings(cfg))
                and same(engine._last_hidden, placement.hidden_sharding()))
  return f"params={params_ok},cache={cache_ok}"


def compare(reference, other, before, after):
  tokens_equal = all(np.array_equal(a.tokens, b.tokens) for a, b in zip(reference, other))
  same_len = [a for a, b in zip(reference, other) if len(a.tokens) == len(b.tokens)]
  logprob_err = max(float(np.max(np.abs(a.logprobs - b.logprobs)))
                    for a, b in zip(reference, other) if len(a.tokens) == len(b.tokens))
  routing_equal = all(np.array_equal(a.expert_indices, b.expert_indices)
                      for a, b in zip(reference, other))
  versions_equal = all(np.array_equal(a.versions, b.versions) for a, b in zip(reference, other))
  return dict(tokens_equal=tokens_equal, compared=len(same_len), logprob_err=logprob_err,
              routing_equal=routing_equal, versions_equal=versions_equal,
              # Tokens sampled both before and after the swap, i.e. it happened in flight.
              before=bool(any(np.any(g.versions == before) for g in other)),
              after=bool(any(np.any(g.versions == after) for g in other)))


def resharded(params, placement):
  """`params` sharded another way than the engine's (as a learner on its own mesh would
  hold them): every array split over its leading dimension where it divides, else
  replicated."""
  mesh = placement.mesh
  flat = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  lead = lambda x: (jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
      ("data", "fsdp", "expert", "context", "tensor"))) if x.shape and x.shape[0] % 8 == 0
      else flat)
  return jax.tree.map(lambda x: jax.device_put(x, lead(x)), params)


def check(num_draft: int, weights_quant: str = "none"):
  cfg, params, updated = make_model()
  host_updated = jax.tree.map(np.asarray, updated)

  def engine(par=None):
    return JaxEngine(cfg, params, num_slots=SLOTS, max_length=MAX_LENGTH,
                     prefill_buckets=BUCKETS, num_draft_tokens=num_draft, seed=0,
                     parallel=par, weights_quant=weights_quant,
                     **({} if num_draft else dict(decode_steps=DECODE_STEPS,
                                                  max_decode_steps=DECODE_STEPS)))

  single = engine()
  reference, _ = run(single, host_updated)
  # The second run on an engine starts from the updated weights and swaps back.
  reference2, _ = run(single, params, 2)
  scored_ref = single.logprobs([r.tokens for r in requests()[1:4]])
  top_ref = single.top_logprobs(requests()[5].tokens, 3, temperature=0.7)
  out = {"devices": jax.device_count()}
  meshes = (dict([SPECULATIVE_MESH]) if num_draft else MESHES if weights_quant == "none"
            else {"data2_expert4": MESHES["data2_expert4"]})
  for name, sizes in meshes.items():
    sharded = engine(parallel_cfg(**sizes))
    # First run: the update arrives as host numpy arrays.
    generations, layouts = run(sharded, host_updated)
    result = compare(reference, generations, 0, 1)
    result["layouts"] = layouts
    result["mesh"] = dict(sharded.placement.mesh.shape)
    result["cache_spec"] = str(jax.tree.leaves(sharded._cache)[0].sharding.spec)
    result["param_specs"] = sorted({str(a.sharding.spec) for a in jax.tree.leaves(sharded._params)})
    result["held"] = sharded.resident_weights()
    # Second run on the same engine: back to the first weights, delivered sharded
    # another way (version 2); the reference does the same.
    again, layouts2 = run(sharded, resharded(params, sharded.placement), 2)
    result["second"] = compare(reference2, again, 1, 2)
    result["second"]["layouts"] = layouts2
    scored = sharded.logprobs([r.tokens for r in requests()[1:4]])
    result["score_err"] = max(float(np.max(np.abs(a - b))) for a, b in zip(scored_ref, scored))
    top = sharded.top_logprobs(requests()[5].tokens, 3, temperature=0.7)
    result["top_ids_equal"] = bool(np.array_equal(top[0], top_ref[0]))
    result["top_err"] = float(np.max(np.abs(top[1] - top_ref[1])))
    if num_draft:
      result["accepted_ref"] = single.acceptance.accepted
      result["accepted"] = sharded.acceptance.accepted
    out[name] = result
  return out


if __name__ == "__main__":
  mode = sys.argv[1]
  print(json.dumps(check(*{"plain": (0,), "speculative": (2,), "int4": (0, "int4")}[mode])))
