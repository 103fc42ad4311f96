"""The learner's data-parallel step: a batch packed for 2 ranks, sharded over 2 devices,
gives the same update as the 1-rank batch on one device."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import functools, json
    import jax, jax.numpy as jnp, numpy as np
    from c2jax import config as configlib, model
    from c2jax.rl.learner import step as learner
    from c2jax.rl.learner import runtime as learner_runtime
    from c2jax.rl.queue.group_store import Group
    from c2jax.train import optimizer as optimizer_lib
    from c2jax.train.step import TrainState

    cfg = configlib.load_config_file("configs/rl.py", "test")
    cfg.rl.group_size, cfg.learner.groups_per_step, cfg.actors.max_length = 2, 2, 32
    cfg.rl.kl.coef = 0.0
    cfg.model.vocab_size = 256
    rng = np.random.default_rng(0)
    lm, k = cfg.model.num_layers - cfg.model.first_k_dense, cfg.model.moe.num_experts_per_tok

    def segment(n):
      mask = (np.arange(n) >= n // 2).astype(np.int32)
      return dict(tokens=rng.integers(1, 256, n).astype(np.int32), valid=np.ones(n, np.int32),
                  loss_mask=mask, sampler_logprobs=(-rng.random(n) * mask).astype(np.float32),
                  versions=np.zeros(n, np.int32),
                  router_indices=rng.integers(0, cfg.model.moe.num_experts, (n, lm, k)
                                              ).astype(np.int32))
    groups = [Group(f"g{i}", 0, np.float32([1, 0]), np.float32([0.5, -0.5]),
                    [segment(n) for n in lengths], np.int32([0, 1]))
              for i, lengths in enumerate([(30, 9), (17, 24)])]
    one, _ = learner_runtime.build_batch(cfg, groups, 1)
    two, metrics = learner_runtime.build_batch(cfg, groups, 2)

    params = model.init(cfg.model, jax.random.PRNGKey(0))
    optimizer, _ = optimizer_lib.make_optimizer(learning_rate=1e-3, total_steps=4,
                                                weight_decay=0.0, end_lr_fraction=1.0)
    state = TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))
    step = jax.jit(functools.partial(learner.rl_step, cfg.rl, cfg.model, optimizer,
                                         rollouts_per_step=learner_runtime.rollouts_per_step(cfg)))
    single, m1 = step(state, None, one)
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ('data',))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    by_rank = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    sharded_batch = jax.device_put(two, by_rank)
    sharded, m2 = step(jax.device_put(state, replicated), None, sharded_batch)
    diff = max(float(jnp.abs(a - b).max()) for a, b in
               zip(jax.tree.leaves(single.params), jax.tree.leaves(sharded.params)))
    rank_rows = [sorted(int(v) for v in (two["tokens"][r * 2:(r + 1) * 2] > 0).sum(-1))
                 for r in range(2)]
    print(json.dumps(dict(devices=mesh.size, diff=diff, loss=[float(m1["loss"]),
                          float(m2["loss"])], rows=len(two["tokens"]), rank_rows=rank_rows,
                          shards=len(sharded_batch["tokens"].addressable_shards),
                          same_rows=sorted(map(tuple, one["tokens"].tolist())) ==
                          sorted(map(tuple, two["tokens"].tolist())))))
""")


@pytest.mark.slow
def test_two_rank_batch_on_two_devices_matches_one_device():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.loads(result.stdout.strip().splitlines()[-1])
  assert out["devices"] == 2 and out["shards"] == 2
  assert out["rows"] == 4 and out["same_rows"]
  # Longest-first balancing: the 30- and 9-token segments share a rank, 24 and 17 the other.
  assert sorted(out["rank_rows"]) == [[9, 30], [17, 24]]
  assert abs(out["loss"][0] - out["loss"][1]) < 1e-6
  assert out["diff"] < 1e-6
