"""Data-parallel scoring over 2 (fake CPU) devices gives the single-device NLL."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent("""
    import json
    import jax, numpy as np
    from c2jax import model
    from c2jax.eval.base import perplexity
    from c2jax.model import variants

    assert jax.device_count() == 2, jax.devices()
    cfg = variants.get("tiny")
    params = jax.jit(lambda key: model.init(cfg, key))(jax.random.key(0))
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 90).astype(np.int32)
    single = perplexity.WindowScorer(cfg, params, window=16, batch_size=4)
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("data",))
    split = perplexity.WindowScorer(cfg, params, window=16, batch_size=4, mesh=mesh)
    a, windows = single.token_nll(ids, 8)
    b, _ = split.token_nll(ids, 8)
    try:
      perplexity.WindowScorer(cfg, params, window=16, batch_size=3, mesh=mesh)
      error = ""
    except ValueError as e:
      error = str(e)
    print(json.dumps({"max_diff": float(np.abs(a - b).max()), "windows": windows,
                      "total": float(a.sum()), "error": error}))
""")


def test_data_parallel_scoring_matches_one_device():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["windows"] == 11 and result["total"] > 0
  assert result["max_diff"] < 1e-4
  assert "multiple of 2" in result["error"]
