"""Multi-device context-parallel measurements, run as a subprocess by test_context_parallel.

    python tests/parallel/context_parallel_checks.py attention|train  -> one JSON line

XLA_FLAGS must give 8 host devices before jax is imported, so this runs in its own
process; the test file asserts on the numbers it prints (errors, losses, jaxpr facts).
Single-device references run in the same process with no mesh set (one device).
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from c2jax import compile_cache, parallel  # noqa: E402
from c2jax.model import attention, variants  # noqa: E402
from c2jax.parallel import context  # noqa: E402
from c2jax.train import jobs, loop, step  # noqa: E402

B, L = 4, 32  # B divides the 4-way batch sharding of every mesh below; L by 2 * CP = 8
# MLA with YaRN, and GQA with q/k norm and rotate-half rope (the two attention types).
CASES = {
    "mla": dict(rope=dict(scaling="yarn", factor=4.0, original_max_position=16,
                          mscale=1.0, mscale_all_dim=1.0)),
    "gqa": dict(attention="gqa", num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True,
                rope=dict(theta=1e6, interleave=False)),
}


def make_mesh(**sizes):
  par = parallel.default_parallel_config()
  par.mesh.update({"data": 1, "fsdp": 1, "expert": 1, "context": 1, "tensor": 1, **sizes})
  return parallel.make_mesh(par.mesh), parallel.rules_of(par)


def packed_rows(rng, vocab=None, padding=0):
  """positions and segment ids [B, L] of 2-4 documents a row (+ `padding` slots of
  segment 0 at the end), and with `vocab` the batch dict of the train step."""
  positions, segments = np.zeros((B, L), np.int32), np.zeros((B, L), np.int32)
  for row in range(B):
    cuts = np.sort(rng.choice(np.arange(3, L - padding - 3), rng.integers(1, 4),
                              replace=False))
    bounds = [0, *cuts, L - padding]
    for doc, (start, end) in enumerate(zip(bounds[:-1], bounds[1:]), start=1):
      positions[row, start:end] = np.arange(end - start)
      segments[row, start:end] = doc
  if vocab is None:
    return positions, segments
  tokens = rng.integers(1, vocab, (B, L + 1)).astype(np.int32)
  same_doc = np.concatenate([segments[:, 1:] == segments[:, :-1], np.zeros((B, 1), bool)], 1)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "positions": positions,
          "segment_ids": segments, "loss_mask": (same_doc & (segments > 0)).astype(np.float32)}


def _max_diff(a, b):
  """Largest |a - b| over the leaves, relative to the leaf's largest |b| (gradients of a
  sum over many tokens are large, so float32 reordering shows in absolute terms)."""
  return max(float(jnp.max(jnp.abs(x - y)) / jnp.maximum(jnp.max(jnp.abs(y)), 1.0))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _gathers_over_context(jaxpr_text: str) -> bool:
  return bool(re.search(r"all_gather\[[^\]]*axis_name=\('context',\)", jaxpr_text))


def attention_layer(name: str, shard_counts: tuple[int, ...]) -> dict:
  """Forward and gradients of one attention layer on 2 / 4 context shards (balanced and
  contiguous layouts) against the same layer on one device."""
  cfg = variants.get("tiny", init_std=0.1, **CASES[name])
  module = attention.ATTENTION[cfg.attention](cfg)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((B, L, cfg.hidden_size)), jnp.float32)
  cotangent = jnp.asarray(rng.standard_normal((B, L, cfg.hidden_size)), jnp.float32)
  positions, segments = packed_rows(rng)
  params = module.init(jax.random.key(1), x, positions, segments)["params"]

  def loss(params, x, positions, segments, cotangent):
    y, _ = module.apply({"params": params}, x, positions, segments)
    return jnp.sum(y * cotangent), y

  value_and_grad = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
  (_, y_ref), (dparams_ref, dx_ref) = jax.jit(value_and_grad)(
      params, x, positions, segments, cotangent)
  out = {}
  for shards in shard_counts:
    mesh, rules = make_mesh(context=shards, fsdp=8 // shards)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      jaxpr = str(jax.make_jaxpr(value_and_grad)(params, x, positions, segments, cotangent))
      run = jax.jit(value_and_grad)
      for layout in ("balanced", "contiguous"):
        to = (functools.partial(context.to_balanced, shards=shards) if layout == "balanced"
              else lambda a: a)
        back = (functools.partial(context.from_balanced, shards=shards)
                if layout == "balanced" else lambda a: a)
        (_, y), (dparams, dx) = run(params, to(x), to(positions), to(segments),
                                    to(cotangent))
        out[f"cp{shards}_{layout}"] = {
            "forward": _max_diff(back(y), y_ref), "dparams": _max_diff(dparams, dparams_ref),
            "dx": _max_diff(back(dx), dx_ref)}
    out[f"cp{shards}_jaxpr"] = {"shard_map": "shard_map" in jaxpr,
                                "all_gather": _gathers_over_context(jaxpr),
                                "reduce_scatter": "reduce_scatter" in jaxpr}
  return out


def train(meshes: list[dict]) -> dict:
  """Losses of 3 real train steps (tiny MLA + MoE, cut to its one MoE layer: the
  context-parallel attention and the expert dispatch of every layer, compiled a third
  faster) on each mesh and on one device."""
  cfg = jobs.job_defaults("tiny")
  cfg.model.num_layers, cfg.model.first_k_dense = 1, 0
  cfg.model.vocab_size = cfg.data.vocab_size = 512
  cfg.model.init_std = 0.1
  cfg.train.batch_size, cfg.train.seq_len, cfg.train.warmup_steps = B, L, 0
  rng = np.random.default_rng(3)
  batches = [packed_rows(rng, vocab=cfg.model.vocab_size, padding=3) for _ in range(3)]

  runtimes = {}
  for sizes in meshes:
    cfg.parallel.mesh.update({"data": 1, "fsdp": 1, "expert": 1, "context": 1, "tensor": 1,
                              **sizes})
    runtimes[",".join(f"{axis}={size}" for axis, size in sizes.items())] = (
        loop.build_runtime(cfg))

  optimizer = next(iter(runtimes.values())).optimizer  # built from cfg.train alone
  run_one = jax.jit(functools.partial(step.train_step, cfg.model, optimizer))
  state = jax.jit(functools.partial(step.create_train_state, cfg.model, optimizer))(
      jax.random.key(cfg.train.seed))
  losses = {"one_device": []}
  for batch in batches:
    state, metrics = run_one(state, batch)
    losses["one_device"].append(float(metrics["loss"]))

  gathers, balanced = {}, {}
  for name, rt in runtimes.items():
    state, step_fn = loop.init_state(rt), loop.make_train_step(rt)
    losses[name] = []
    with rt.scope():
      placed = loop.device_batch(rt, batches[0])
      gathers[name] = _gathers_over_context(str(jax.make_jaxpr(step_fn)(state, placed)))
      for batch in batches:
        state, metrics = step_fn(state, loop.device_batch(rt, batch))
        losses[name].append(float(metrics["loss"]))
    balanced[name] = bool(np.array_equal(
        np.asarray(placed["positions"]), context.to_balanced(batches[0]["positions"], 2)))
  return {"losses": losses, "gathers_over_context": gathers, "batch_balanced": balanced}


if __name__ == "__main__":
  compile_cache.enable()
  which = sys.argv[1]
  if which == "attention":
    result = {"mla": attention_layer("mla", (2, 4)), "gqa": attention_layer("gqa", (2,))}
  elif which == "train":
    result = train([{"context": 2, "fsdp": 4}, {"expert": 4, "context": 2}])
  else:
    raise SystemExit(f"unknown check {which!r}; use attention or train")
  print(json.dumps(result))
