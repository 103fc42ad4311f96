"""The RL learner step on sharded meshes, run as a subprocess by test_rl_sharded.

    python tests/rl/rl_sharded_checks.py meshes        -> one JSON line (8 fake devices)
    python tests/rl/rl_sharded_checks.py distributed   -> one JSON line (one process of a
        jax.distributed job, or a single process; XLA_FLAGS / JAX_* set by the test)

Three RL steps of the tiny MLA + MoE policy (router replay, KL to a reference, sampling
temperature 0.8) on the learner runtime (c2jax.rl.learner.runtime), from the same starting
state and the same packed batches; the test compares losses and parameters.
"""

import os
import sys

if sys.argv[1] == "meshes":
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from c2jax import compile_cache  # noqa: E402
from c2jax.parallel import distributed  # noqa: E402
from c2jax.rl import job  # noqa: E402
from c2jax.rl.learner import step as learner
from c2jax.rl.learner import runtime as learner_runtime
from c2jax.rl.queue.group_store import Group  # noqa: E402
from c2jax.train import runtime  # noqa: E402
from tests.rl.rl_testlib import random_segment  # noqa: E402

STEPS, LENGTH, ROWS = 3, 16, 8
MESHES = {"fsdp8": {"fsdp": 8}, "data2_fsdp2_expert2": {"data": 2, "fsdp": 2, "expert": 2},
          "expert4_context2": {"expert": 4, "context": 2}}


def config(mesh_sizes):
  cfg = job.job_defaults("tiny")
  # The tiny policy cut to its one MLA + MoE layer (the dense layer before it adds nothing
  # a mesh treats differently): every process and mesh compiles a quarter less.
  cfg.model.num_layers, cfg.model.first_k_dense = 1, 0
  cfg.model.vocab_size = cfg.data.vocab_size = 512
  cfg.model.moe.aux_loss_coef = 0.01
  cfg.rl.group_size, cfg.learner.groups_per_step = 2, 2
  cfg.rl.kl.coef = 0.05
  cfg.agent.temperature = 0.8
  cfg.learner.learning_rate, cfg.learner.steps = 1e-3, STEPS
  cfg.actors.max_length, cfg.agent.max_turn_tokens = LENGTH, LENGTH // 2
  cfg.parallel.mesh.update({"data": 1, "fsdp": 1, "expert": 1, "context": 1, "tensor": 1,
                            **mesh_sizes})
  return cfg


def batches(cfg):
  """STEPS packed batches of two groups of two rollouts each (one rollout with two
  segments), ROWS rows: enough for every mesh's batch ways."""
  rng = np.random.default_rng(0)
  segments = lambda *lengths: [random_segment(cfg.model, rng, n) for n in lengths]
  out = []
  for _ in range(STEPS):
    groups = [Group("a", 0, np.float32([1, 0]), np.float32([0.5, -0.5]),
                    segments(16, 9, 12), np.int32([0, 0, 1])),
              Group("b", 0, np.float32([0, 1]), np.float32([-0.7, 0.7]),
                    segments(14, 5), np.int32([0, 1]))]
    batch, _ = learner_runtime.build_batch(cfg, groups, ROWS)
    out.append(batch)
  return out


def run_steps(rt, host_state, host_ref, host_batches):
  """Losses and final parameters of STEPS sharded steps."""
  state = jax.device_put(host_state, rt.state_shardings)
  ref = jax.device_put(host_ref, rt.state_shardings.params)
  step_fn, losses = learner_runtime.make_step(rt), []
  with rt.scope():
    for i, batch in enumerate(host_batches):
      placed = rt.place(batch)
      if i == 0:
        hlo = step_fn.lower(state, ref, placed).as_text()
      state, metrics = step_fn(state, ref, placed)
      losses.append(float(metrics["loss"]))
  return state, losses, hlo


def reference_steps(cfg, rt, host_state, host_ref, host_batches):
  """The same steps on one device, no mesh, the pure rl_step."""
  step_fn = jax.jit(functools.partial(
      learner.rl_step, cfg.rl, rt.model_cfg, rt.optimizer,
      rollouts_per_step=learner_runtime.rollouts_per_step(cfg),
      temperature=float(cfg.agent.temperature)))
  state, losses = host_state, []
  for batch in host_batches:
    state, metrics = step_fn(state, host_ref, batch)
    losses.append(float(metrics["loss"]))
  return jax.device_get(state), losses


def max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def shard_fraction(state):
  """The fraction of the parameters and optimizer state device 0 holds (1 = replicated)."""
  leaves = jax.tree.leaves((state.params, state.opt_state))
  held = sum(shard.data.size for leaf in leaves for shard in leaf.addressable_shards
             if shard.device == jax.devices()[0])
  return held / sum(leaf.size for leaf in leaves)


def run_meshes():
  results = {}
  host_state = host_ref = host_batches = None
  for name, sizes in MESHES.items():
    cfg = config(sizes)
    job.validate(cfg, jax.device_count())
    rt = learner_runtime.build(cfg)
    if host_state is None:
      host_state = jax.device_get(runtime.init_state(rt))
      host_ref = jax.device_get(host_state.params)
      host_batches = batches(cfg)
      state, losses = reference_steps(cfg, rt, host_state, host_ref, host_batches)
      results["one_device"] = {"losses": losses, "attention": cfg.model.attention,
                               "moe_layers": cfg.model.num_layers - cfg.model.first_k_dense}
      one_device_params = state.params
    state, losses, hlo = run_steps(rt, host_state, host_ref, host_batches)
    results[name] = {"losses": losses,
                     "param_diff": max_diff(jax.device_get(state.params), one_device_params),
                     "step": int(state.step), "shard_fraction": shard_fraction(state),
                     "batch_ways": rt.batch_ways(), "context_shards": rt.context_shards(),
                     "all_to_all": "all-to-all" in hlo or "all_to_all" in hlo}
  return results


def run_distributed():
  """One step sequence on a data=2, fsdp=devices/2 mesh over whatever processes joined."""
  cfg = config({"data": 2, "fsdp": -1})
  distributed.initialize(cfg.parallel.distributed)
  job.validate(cfg, jax.device_count())
  rt = learner_runtime.build(cfg)
  state = runtime.init_state(rt)
  ref = runtime.copy_params(rt, state.params)
  step_fn, losses = learner_runtime.make_step(rt), []
  with rt.scope():
    for batch in batches(cfg):
      state, metrics = step_fn(state, ref, rt.place(batch))
      losses.append(float(metrics["loss"]))
  # Summed over this process's shards plus the others': a global reduction on device.
  param_sum = float(jax.jit(lambda p: sum(jax.numpy.sum(x.astype("float32"))
                                          for x in jax.tree.leaves(p)))(state.params))
  return {"process": [jax.process_index(), jax.process_count()],
          "devices": [jax.local_device_count(), jax.device_count()],
          "losses": losses, "param_sum": param_sum}


if __name__ == "__main__":
  if sys.argv[1] == "meshes":
    compile_cache.enable()
  print(json.dumps({"meshes": run_meshes, "distributed": run_distributed}[sys.argv[1]]()))
