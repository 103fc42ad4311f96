"""Multi-device expert-parallel measurements, run as a subprocess by test_expert_parallel.

    python tests/parallel/expert_parallel_checks.py dispatch|train  -> one JSON line

XLA_FLAGS must give 8 host devices before jax is imported, so this runs in its own
process; the test file asserts on the numbers it prints (errors, counts, losses).
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools  # noqa: E402
import json  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import c2jax_kernels as kernels  # noqa: E402
from c2jax import compile_cache, parallel  # noqa: E402
from c2jax.model import moe, moe_dispatch, variants  # noqa: E402
from c2jax.parallel import expert, expert_ragged  # noqa: E402
from c2jax.plan import hlo_comms  # noqa: E402
from c2jax.train import jobs, loop  # noqa: E402
from c2jax.train import step as step_lib  # noqa: E402

E, K, D, F = 8, 2, 32, 16
UNUSED_EXPERTS = (3, 6)  # no token is routed to these: their shards get empty groups


def make_mesh(**sizes):
  par = parallel.default_parallel_config()
  par.mesh.update({"data": 1, "fsdp": 1, "expert": 1, "context": 1, "tensor": 1, **sizes})
  return parallel.make_mesh(par.mesh), parallel.rules_of(par)


def inputs(num_tokens, seed=0):
  rng = np.random.default_rng(seed)
  used = [e for e in range(E) if e not in UNUSED_EXPERTS]
  indices = np.stack([rng.choice(used, K, replace=False) for _ in range(num_tokens)])
  arrays = dict(
      x=rng.standard_normal((num_tokens, D)), weights=rng.uniform(0.1, 1.0, (num_tokens, K)),
      experts=moe_dispatch.ExpertWeights(*(0.3 * rng.standard_normal(s) for s in
                                           ((E, D, F), (E, D, F), (E, F, D)))),
      cotangent=rng.standard_normal((num_tokens, D)))
  arrays = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), arrays)
  return arrays, jnp.asarray(indices, jnp.int32)


def kept_copies(indices, token_ways, num_shards, cap):
  """Explicit drop rule: per token shard (contiguous rows) and destination shard, the
  first `cap` copies in (token, k) order are kept."""
  indices = np.asarray(indices)
  keep = np.zeros(indices.shape, bool)
  per_shard = -(-indices.shape[0] // token_ways)
  for start in range(0, indices.shape[0], per_shard):
    used = np.zeros(num_shards, int)
    for t in range(start, min(start + per_shard, indices.shape[0])):
      for k in range(indices.shape[1]):
        dest = indices[t, k] // (E // num_shards)
        keep[t, k] = used[dest] < cap
        used[dest] += 1
  return keep


def loss_and_grads(forward, a, indices, collectives=False):
  """(y, dropped, grads), and with `collectives` the compiled step's all-reduce and
  reduce-scatter operand bytes per device."""
  def objective(x, weights, experts):
    y, dropped = forward(x, weights, indices, experts)
    return jnp.sum(y * a["cotangent"]), (y, dropped)
  step = jax.jit(jax.value_and_grad(objective, argnums=(0, 1, 2), has_aux=True))
  args = (a["x"], a["weights"], a["experts"])
  (_, (y, dropped)), grads = step(*args)
  if not collectives:
    return y, dropped, grads
  volumes = hlo_comms.comm_volume(step.lower(*args).compile().as_text())
  return y, dropped, grads, {kind: volumes[kind].operand_bytes
                             for kind in ("all-reduce", "reduce-scatter")}


def max_diff(tree_a, tree_b):
  return max(float(jnp.max(jnp.abs(p - q))) for p, q in
             zip(jax.tree.leaves(tree_a), jax.tree.leaves(tree_b)))


def dispatch_case(mesh_sizes, num_tokens, capacity_factor=0.0, dispatch_quant="none",
                  local="ragged", logical_axes=moe_dispatch.EXPERT_AXES, exchange="fixed"):
  """EP against the dense reference. With `logical_axes` (as the MoE layer passes them)
  the weights' FSDP dimensions are gathered inside the shard_map; None gathers them
  on entry. exchange='ragged' runs c2jax.parallel.expert_ragged (on the CPU through its
  all-gather emulation of the ragged all-to-all)."""
  mesh, rules = make_mesh(**mesh_sizes)
  a, indices = inputs(num_tokens)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    plan = expert.plan_from_context()
    ep = functools.partial(expert.moe_forward, plan=plan,
                           local_dispatch=moe_dispatch.DISPATCH[local],
                           capacity_factor=capacity_factor, dispatch_quant=dispatch_quant,
                           logical_axes=logical_axes, exchange=exchange,
                           local_grouped=functools.partial(
                               moe_dispatch.grouped_experts,
                               impl=moe_dispatch.grouped_impl(local)))
    y, dropped, grads, collectives = loss_and_grads(ep, a, indices, collectives=True)
    hlo = jax.jit(ep).lower(a["x"], a["weights"], indices, a["experts"]).as_text()
  cap = expert.capacity(-(-num_tokens // plan.token_ways), K, plan.num_shards,
                        capacity_factor)
  keep = kept_copies(indices, plan.token_ways, plan.num_shards, cap)
  fmt = expert.DISPATCH_FORMATS[dispatch_quant]
  quantized = (lambda x: x) if fmt is None else (
      lambda x: kernels.dequantize(kernels.quantize(x, fmt, axis=-1)))

  def reference(x, weights, indices, experts):
    # Straight-through quantisation: forward at q(x), gradient passed to x unchanged.
    x_seen = x + jax.lax.stop_gradient(quantized(x) - x)
    y = moe_dispatch.dense(x_seen, weights * jnp.asarray(keep, jnp.float32), indices,
                           experts)
    return y, jnp.int32(np.sum(~keep))
  y_ref, dropped_ref, grads_ref = loss_and_grads(reference, a, indices)
  y_plain = moe_dispatch.dense(a["x"], a["weights"], indices, a["experts"])
  return {"expert_axes": list(plan.expert_axes), "token_axes": list(plan.token_axes),
          "capacity": cap, "dropped": int(dropped), "dropped_ref": int(dropped_ref),
          "y_err": max_diff(y, y_ref), "grad_err": max_diff(grads, grads_ref),
          "y_scale": float(jnp.max(jnp.abs(y_ref))),
          "diff_from_plain": max_diff(y, y_plain), "collectives": collectives,
          "local_expert_bytes": _expert_bytes(a) // plan.num_shards,
          "all_to_all": "all_to_all" in hlo or "all-to-all" in hlo,
          "all_gather": "all_gather" in hlo or "all-gather" in hlo}


def emulated_ragged_example():
  """The example of `lax.ragged_all_to_all`'s docstring, through the CPU emulation."""
  mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
  put = lambda rows: jax.device_put(jnp.asarray(rows, jnp.int32).reshape(-1),
                                    jax.sharding.NamedSharding(mesh, P("x")))
  operand = put([[1, 2, 2], [3, 4, 0]])
  input_offsets, send_sizes = put([[0, 1], [0, 1]]), put([[1, 2], [1, 1]])
  output_offsets, recv_sizes = put([[0, 0], [1, 2]]), put([[1, 1], [2, 1]])
  exchange = jax.shard_map(
      lambda o, *offsets: expert_ragged.emulated_ragged_all_to_all(
          o, jnp.zeros(4, o.dtype), *offsets, axis_name="x"),
      mesh=mesh, in_specs=(P("x"),) * 5, out_specs=P("x"))
  result = jax.jit(exchange)(operand, input_offsets, send_sizes, output_offsets, recv_sizes)
  return np.asarray(result).reshape(2, 4).tolist()


def token_local_case(mesh_sizes, num_tokens, logical_axes=moe_dispatch.EXPERT_AXES):
  """`token_local_forward` (what Pallas dispatch takes on a TPU or GPU without EP) on a
  mesh that splits tokens and the weights' embed dim, against the dense reference."""
  mesh, rules = make_mesh(**mesh_sizes)
  a, indices = inputs(num_tokens)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    token_axes = expert.token_axes_from_context()
    local = functools.partial(expert.token_local_forward, token_axes=token_axes,
                              local_dispatch=moe_dispatch.DISPATCH["ragged"],
                              logical_axes=logical_axes)
    y, _, grads, collectives = loss_and_grads(
        lambda *args: (local(*args), jnp.int32(0)), a, indices, collectives=True)
  dense = lambda x, w, i, e: (moe_dispatch.dense(x, w, i, e), jnp.int32(0))
  y_ref, _, grads_ref = loss_and_grads(dense, a, indices)
  return {"token_axes": list(token_axes), "y_err": max_diff(y, y_ref),
          "grad_err": max_diff(grads, grads_ref), "collectives": collectives,
          "expert_bytes": _expert_bytes(a)}


def _expert_bytes(arrays) -> int:
  """Bytes of all experts' weights (gate, up, down)."""
  return sum(w.nbytes for w in jax.tree.leaves(arrays["experts"]))


def moe_layer_case():
  """The MoE layer (router replay, loads) on an expert=4 mesh against no mesh at all."""
  cfg = variants.get("tiny", hidden_size=D, init_std=0.5,
                     moe=dict(num_experts=E, num_experts_per_tok=K, intermediate_size=F))
  x_BxLxD = jax.random.normal(jax.random.key(0), (8, 2, D))
  shapes = nn.unbox(jax.eval_shape(lambda: moe.MoE(cfg).init(jax.random.key(0), x_BxLxD)))
  rng = np.random.default_rng(1)
  params = jax.tree.map(lambda a: jnp.asarray(0.5 * rng.standard_normal(a.shape),
                                              jnp.float32), shapes["params"])
  # Random replayed experts: mostly not what the router itself would choose.
  replay = jnp.asarray(rng.integers(0, E, (8, 2, K)), jnp.int32)
  apply = jax.jit(lambda p, x, r: moe.MoE(cfg).apply({"params": p}, x, r))
  y_ref, stats_ref = apply(params, x_BxLxD, replay)
  mesh, rules = make_mesh(data=2, expert=4)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    y, stats = apply(params, x_BxLxD, replay)
    hlo = apply.lower(params, x_BxLxD, replay).as_text()
  return {"y_err": max_diff(y, y_ref),
          "indices_equal": bool(jnp.all(stats["expert_indices"] == replay)),
          "loads_err": max_diff(stats["expert_loads"], stats_ref["expert_loads"]),
          "dropped": float(stats["dropped_copies"]),
          "all_to_all": "all_to_all" in hlo or "all-to-all" in hlo}


def run_dispatch():
  return {
      "expert4": dispatch_case({"data": 2, "expert": 4}, 32),
      "expert4_drops_uneven": dispatch_case({"data": 2, "expert": 4}, 13,
                                            capacity_factor=0.5, local="dense"),
      "data2_fsdp2_expert2": dispatch_case({"data": 2, "fsdp": 2, "expert": 2}, 32),
      "data2_fsdp2_expert2_entry_gather": dispatch_case(
          {"data": 2, "fsdp": 2, "expert": 2}, 32, logical_axes=None),
      "data2_fsdp2_expert2_drops": dispatch_case({"data": 2, "fsdp": 2, "expert": 2}, 32,
                                                 capacity_factor=1.0),
      "expert4_mxfp8": dispatch_case({"data": 2, "expert": 4}, 32, dispatch_quant="mxfp8"),
      "expert4_ragged": dispatch_case({"data": 2, "expert": 4}, 32, exchange="ragged"),
      "expert4_ragged_uneven": dispatch_case({"data": 2, "expert": 4}, 13, exchange="ragged"),
      "data2_fsdp2_expert2_ragged": dispatch_case({"data": 2, "fsdp": 2, "expert": 2}, 32,
                                                  exchange="ragged"),
      "expert4_ragged_mxfp8": dispatch_case({"data": 2, "expert": 4}, 32,
                                            dispatch_quant="mxfp8", exchange="ragged"),
      "emulated_ragged_example": emulated_ragged_example(),
      "moe_layer": moe_layer_case(),
      "token_local_data2_fsdp4": token_local_case({"data": 2, "fsdp": 4}, 30),
      "token_local_data2_fsdp4_entry_gather": token_local_case({"data": 2, "fsdp": 4}, 30,
                                                               logical_axes=None),
  }


# Without and with expert parallelism; the EP mesh splits tokens over data, fsdp and expert
# at once (expert4 alone is covered by the dispatch cases above).
TRAIN_MESHES = {"fsdp8": {"fsdp": 8}, "data2_fsdp2_expert2": {"data": 2, "fsdp": 2, "expert": 2}}
TRAIN_STEPS, BATCH, SEQ = 3, 8, 16


def train_batches(vocab):
  rng = np.random.default_rng(0)
  for _ in range(TRAIN_STEPS):
    tokens = rng.integers(0, vocab, (BATCH, SEQ + 1)).astype(np.int32)
    segments = np.ones((BATCH, SEQ), np.int32)
    segments[0, SEQ // 2:] = 0  # some padding, left out of loads and loss
    yield {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "positions": np.broadcast_to(np.arange(SEQ, dtype=np.int32), (BATCH, SEQ)),
           "segment_ids": segments, "loss_mask": (segments > 0).astype(np.float32)}


def run_train():
  """The tiny MoE model (its one MoE layer: the dense layer before it proves nothing
  here), 3 real train steps per mesh, against one device."""
  cfg = jobs.job_defaults("tiny")
  cfg.model.num_layers, cfg.model.first_k_dense = 1, 0
  cfg.model.vocab_size = 512
  cfg.model.moe.aux_loss_coef = 0.01
  cfg.data.vocab_size = 512
  cfg.train.update(steps=TRAIN_STEPS, batch_size=BATCH, seq_len=SEQ, warmup_steps=1)
  results = {}
  host_state = None
  for name, sizes in TRAIN_MESHES.items():
    cfg.parallel.mesh.update({"data": 1, "fsdp": 1, "expert": 1, "context": 1, "tensor": 1,
                              **sizes})
    rt = loop.build_runtime(cfg)
    if host_state is None:  # every run starts from the same values, made off-mesh
      host_state = jax.device_get(jax.jit(functools.partial(
          step_lib.create_train_state, cfg.model, rt.optimizer))(jax.random.key(0)))
      reference = jax.jit(functools.partial(step_lib.train_step, cfg.model, rt.optimizer))
      state, losses = host_state, []
      for batch in train_batches(cfg.model.vocab_size):
        state, metrics = reference(state, batch)
        losses.append(float(metrics["loss"]))
      results["one_device"] = {"losses": losses,
                               "bias": np.asarray(_bias(state.params)).tolist()}
    state = jax.device_put(host_state, rt.state_shardings)
    step_fn, losses, dropped = loop.make_train_step(rt), [], []
    with rt.scope():
      for i, batch in enumerate(train_batches(cfg.model.vocab_size)):
        device_batch = loop.device_batch(rt, batch)
        if i == 0:
          hlo = step_fn.lower(state, device_batch).as_text()
        state, metrics = step_fn(state, device_batch)
        losses.append(float(metrics["loss"]))
        dropped.append(float(metrics["dropped_copies"]))
    results[name] = {"losses": losses, "dropped": dropped,
                     "bias": np.asarray(_bias(state.params)).tolist(),
                     "all_to_all": "all_to_all" in hlo or "all-to-all" in hlo}
  return results


def _bias(params):
  return params["moe_layers"]["moe"]["router"]["correction_bias"]


if __name__ == "__main__":
  compile_cache.enable()
  checks = {"dispatch": run_dispatch, "train": run_train}
  print(json.dumps(checks[sys.argv[1]]()))
