"""One JaxEngine over several JAX processes (2 fake CPU devices each), run by
test_engine_processes: every process runs this file with JAX_COORDINATOR_ADDRESS /
JAX_NUM_PROCESSES / JAX_PROCESS_ID set and ENGINE_MESH (JSON axis sizes); optionally
ENGINE_WEIGHTS_QUANT, ENGINE_MODEL=small (by hand), ENGINE_HANG_AT / ENGINE_HANG_TIMEOUT_S,
ENGINE_ONE_PASS (the first pass of requests and swaps only, against one device).

    python tests/rollout/engine_processes_checks.py   -> one JSON line per process

Process 0 schedules the requests of engine_sharding_checks (greedy and seeded sampling,
more requests than slots, a weight swap mid-generation), scores sequences, then stops
the followers and runs the same on a one-device engine of its own; it prints the
differences. The other processes follow (JaxEngine.follow), loading swapped weights by
version, and print what they ran.
"""

import json
import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from c2jax import compile_cache  # noqa: E402
from c2jax.parallel import distributed  # noqa: E402


def main() -> None:
  distributed.initialize(distributed.distributed_defaults())
  assert len(jax.local_devices()) == 2  # the backend starts now, with 2 devices a process
  # Imported after the backend started: the module sets XLA_FLAGS for its own runs.
  from c2jax.rollout import JaxEngine  # pylint: disable=g-import-not-at-top
  from tests.rollout import engine_sharding_checks as checks  # pylint: disable=g-import-not-at-top

  cfg, params, updated = checks.make_model()
  params = jax.tree.map(np.asarray, params)
  host_updated = jax.tree.map(np.asarray, updated)
  versions = {1: host_updated, 2: params}
  sizes = json.loads(os.environ["ENGINE_MESH"])

  def engine(par=None, weights_quant="none"):
    return JaxEngine(cfg, params, num_slots=checks.SLOTS, max_length=checks.MAX_LENGTH,
                     prefill_buckets=checks.BUCKETS, seed=0, parallel=par,
                     decode_steps=checks.DECODE_STEPS, max_decode_steps=checks.DECODE_STEPS,
                     weights_quant=weights_quant,
                     hang_timeout_s=float(os.environ.get("ENGINE_HANG_TIMEOUT_S", 600)))

  quant = os.environ.get("ENGINE_WEIGHTS_QUANT", "none")
  spread = engine(checks.parallel_cfg(**sizes), quant)

  def load(version):
    while version not in versions:  # ENGINE_HANG_AT below: a read that never ends
      time.sleep(1)
    return versions[version]

  if not spread.is_leader:
    spread.follow(load)
    print(json.dumps({"process": jax.process_index(), "followed": spread.version}))
    return
  generations, layouts = checks.run(spread, host_updated)
  if os.environ.get("ENGINE_ONE_PASS"):  # the first pass (its two swaps) only
    spread.stop_followers()
    reference, _ = checks.run(engine(weights_quant=quant), host_updated)
    result = checks.compare(reference, generations, 0, 1)
    result["processes"], result["devices"] = jax.process_count(), jax.device_count()
    result["mesh"] = {k: v for k, v in spread.placement.mesh.shape.items() if v > 1}
    print(json.dumps(result), flush=True)
    return
  again, _ = checks.run(spread, params, 2)
  sequences = [r.tokens for r in checks.requests()[1:4]]
  scored = spread.logprobs(sequences)
  top = spread.top_logprobs(checks.requests()[5].tokens, 3, temperature=0.7)
  held = spread.resident_weights()
  # ENGINE_HANG_AT=V: the checks end with a swap to version V, which the followers never
  # finish loading (a stuck read), so the leader waits inside installing it: the
  # watchdog ends both (exit 1, naming the follower). Until then the followers wait.
  hang_at = int(os.environ.get("ENGINE_HANG_AT", -1))
  if hang_at < 0:
    spread.stop_followers()

  single = engine(weights_quant=quant)
  reference, _ = checks.run(single, host_updated)
  reference2, _ = checks.run(single, params, 2)
  result = checks.compare(reference, generations, 0, 1)
  result["second"] = checks.compare(reference2, again, 1, 2)
  result["layouts"] = layouts
  result["score_err"] = max(float(np.max(np.abs(a - b)))
                            for a, b in zip(single.logprobs(sequences), scored))
  top_ref = single.top_logprobs(checks.requests()[5].tokens, 3, temperature=0.7)
  result["top_ids_equal"] = bool(np.array_equal(top[0], top_ref[0]))
  result["processes"], result["devices"] = jax.process_count(), jax.device_count()
  result["mesh"] = {k: v for k, v in spread.placement.mesh.shape.items() if v > 1}
  result["held"] = held
  print(json.dumps(result), flush=True)
  if hang_at >= 0:
    spread.update_params(host_updated, hang_at)
    spread.generate(checks.requests()[:1])
    raise AssertionError(f"installing weights version {hang_at} completed")


if __name__ == "__main__":
  compile_cache.enable()  # the processes compile each program of the engine once
  sys.exit(main())
