"""Multi-process JAX on loopback: 4 CPU processes x 2 fake devices form one 8-device mesh,
take one train step of the tiny model and evaluate shards that run out at different
batches; they must match a 1-process, 8-device run. (The tiny model is cut to one MoE
layer, since five processes compile it; two processes run the whole `c2jax pretrain` in
tests/train/test_preemption_distributed.py.) A SLURM step's environment is detected by
JAX's own cluster detection.

This file is also the worker: `python test_distributed.py` prints one JSON line.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from c2jax import compile_cache
from c2jax import config as configlib
from c2jax.parallel import distributed, mesh
from tests.subprocess_checks import child_env, json_result

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT_S = 420


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def _env(devices: int, **extra) -> dict:
  return child_env(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", **extra)


def _result(process: subprocess.Popen) -> dict:
  return json_result(process, TIMEOUT_S)


def _launch(processes: int, devices_each: int):
  """`processes` workers of `devices_each` devices, and one worker with all the devices."""
  worker = [sys.executable, __file__]
  port = _free_port()
  group = [subprocess.Popen(worker, env=_env(devices_each,
                                             JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                                             JAX_NUM_PROCESSES=processes, JAX_PROCESS_ID=rank,
                                             EVAL_SHARDS=processes),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for rank in range(processes)]
  single = subprocess.Popen(worker, env=_env(processes * devices_each, EVAL_SHARDS=processes),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
  return [_result(p) for p in group], _result(single)


@pytest.mark.slow  # five JAX processes each compile the tiny train and eval steps
def test_four_processes_of_two_devices_form_one_mesh_and_match_one_process_of_eight():
  group, single = _launch(4, 2)
  assert single["devices"] == [8, 8] and single["process"] == [0, 1]
  for rank, result in enumerate(group):
    assert result["process"] == [rank, 4]
    assert result["devices"] == [2, 8]
    # The hybrid mesh puts the processes on the outer data-like axis (fsdp here).
    assert result["fsdp_processes"] == [0, 0, 1, 1, 2, 2, 3, 3]
    for key in ("loss", "grad_norm", "param_sum", "eval_loss"):
      np.testing.assert_allclose(result[key], single[key], rtol=2e-5, err_msg=key)
  # Every process computes the same global loss; eval shards that ran out at different
  # batches (4, 3, 2 and 1) still gave every process the same mean.
  assert len({r["loss"] for r in group}) == 1 and len({r["eval_loss"] for r in group}) == 1
  # The leader's host-side helpers (c2jax rl's batch broadcast and weight gather).
  for result in group + [single]:
    assert result["shared"] == {"ids": list(range(7)), "x": [[0.0] * 3] * 2}
    assert result["stopped"]
  assert all(r["gathered_sum"] is None for r in group[1:])
  for result in (group[0], single):
    np.testing.assert_allclose(result["gathered_sum"], single["param_sum"], rtol=2e-5)


def test_resolve_reads_config_then_environment():
  cfg = distributed.distributed_defaults()
  assert distributed.resolve(cfg, {}) is None  # no coordinator: single process
  env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
         "JAX_PROCESS_ID": "3"}
  assert distributed.resolve(cfg, env) == distributed.Settings("10.0.0.1:1234", 4, 3, 300)
  cfg.process_id = 1  # config wins over the environment
  assert distributed.resolve(cfg, env).process_id == 1
  with pytest.raises(configlib.ConfigError, match="num_processes"):
    distributed.resolve(cfg, {"JAX_COORDINATOR_ADDRESS": "h:1"})
  with pytest.raises(configlib.ConfigError, match="process_id"):
    distributed.resolve(cfg, {**env, "JAX_NUM_PROCESSES": "1"})


SLURM_STEP = {"SLURM_JOB_ID": "81234", "SLURM_STEP_NODELIST": "gpu[017-020],gpu031",
              "SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
              "SLURM_STEP_NUM_NODES": "5"}


def test_a_slurm_step_is_detected(monkeypatch):
  for name in distributed.ENV.values():
    monkeypatch.delenv(name, raising=False)
  monkeypatch.delenv("JAX_COORDINATOR_PORT", raising=False)
  for name, value in SLURM_STEP.items():
    monkeypatch.setenv(name, value)
  cfg = distributed.distributed_defaults()
  # The first node of the step; the port derived from the job id (81234 % 4096 + 61440).
  assert distributed.resolve(cfg) == distributed.Settings(
      "gpu017:64850", 8, 5, 300, cluster="slurm")
  monkeypatch.setenv("JAX_COORDINATOR_PORT", "7777")
  assert distributed.resolve(cfg).coordinator_address == "gpu017:7777"
  # Explicit JAX_* variables (or config) still win over what SLURM says.
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.1.1.1:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "1")
  assert distributed.resolve(cfg) == distributed.Settings("10.1.1.1:1234", 2, 1, 300)
  for name in distributed.ENV.values():
    monkeypatch.delenv(name)
  monkeypatch.setenv("SLURM_NTASKS", "1")  # a one-task step is a single-process job
  assert distributed.resolve(cfg) is None
  for name in SLURM_STEP:
    monkeypatch.delenv(name)
  assert distributed.detect_cluster() is None


def test_dcn_shape_spreads_granules_over_data_then_fsdp():
  sizes = {"data": 2, "fsdp": 8, "expert": 8, "context": 2, "tensor": 1}
  assert mesh.dcn_shape(sizes, 4) == {"data": 2, "fsdp": 2, "expert": 1, "context": 1,
                                      "tensor": 1}
  assert mesh.dcn_shape(sizes, 1)["fsdp"] == 1
  with pytest.raises(configlib.ConfigError, match="data-like"):
    mesh.dcn_shape(sizes, 32)


def _worker() -> None:
  import jax
  import jax.numpy as jnp

  from c2jax.train import loop

  cfg = configlib.load_config_file(REPO / "configs/pretrain.py", "tiny")
  distributed.initialize(cfg.parallel.distributed)
  cfg.train.batch_size, cfg.train.seq_len = max(4, jax.device_count()), 16
  # One MoE layer (attention, router, routed and shared experts) in place of tiny's
  # dense + MoE pair: each of the five processes compiles a quarter less.
  cfg.model.num_layers, cfg.model.first_k_dense = 1, 0
  rt = loop.build_runtime(cfg)
  state = loop.init_state(rt)
  rng = np.random.default_rng(0)
  shape = (cfg.train.batch_size, cfg.train.seq_len)
  host_batch = {
      "inputs": rng.integers(0, cfg.model.vocab_size, shape, dtype=np.int32),
      "targets": rng.integers(0, cfg.model.vocab_size, shape, dtype=np.int32),
      "positions": np.broadcast_to(np.arange(shape[1], dtype=np.int32), shape).copy(),
      "segment_ids": np.ones(shape, np.int32),
      "loss_mask": np.ones(shape, np.float32)}
  batch = {key: jax.make_array_from_callback(shape, rt.batch_sharding,
                                             lambda index, v=value: v[index])
           for key, value in host_batch.items()}
  with rt.scope():
    state, metrics = loop.make_train_step(rt)(state, batch)
    param_sum = jax.jit(lambda p: sum(jnp.sum(x.astype(jnp.float32))
                                      for x in jax.tree.leaves(p)))(state.params)
  eval_loss = _uneven_eval(rt, cfg, state.params)
  fsdp = rt.mesh.axis_names.index("fsdp")
  processes = np.moveaxis(rt.mesh.devices, fsdp, 0).reshape(rt.mesh.shape["fsdp"], -1)
  # Process 0's host arrays reach every process; a None from it reaches them as None.
  mine = {"ids": np.arange(7, dtype=np.int32) + 10 * jax.process_index(),
          "x": np.full((2, 3), jax.process_index(), np.float32)}
  shared = distributed.broadcast_arrays(mine)
  stopped = distributed.broadcast_arrays(None if distributed.is_leader() else mine)
  gathered = distributed.gather_for_leader(state.params)
  print(json.dumps({
      "shared": {k: v.tolist() for k, v in shared.items()}, "stopped": stopped is None,
      "gathered_sum": None if gathered is None else float(
          sum(np.sum(np.asarray(x, np.float32)) for x in jax.tree.leaves(gathered))),
      "process": [jax.process_index(), jax.process_count()],
      "devices": [jax.local_device_count(), jax.device_count()],
      "fsdp_processes": [int(row[0].process_index) for row in processes],
      "loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"]),
      "param_sum": float(param_sum), "eval_loss": eval_loss}), flush=True)


def _uneven_eval(rt, cfg, params) -> float:
  """loop.evaluate where the group's eval shards run out at different batches: process q
  of P holds P - q batches. The one-process run evaluates the same rows as global
  batches (a shard that has run out contributes rows without loss tokens), so both must
  give the same mean over the real tokens."""
  import jax

  from c2jax.data import packing
  from c2jax.train import loop

  group = int(os.environ["EVAL_SHARDS"])
  rows = cfg.train.batch_size // group

  def shard_batch(i, q):
    if i >= group - q:
      return packing.empty_rows(rows, cfg.train.seq_len)
    rng = np.random.default_rng(100 + 10 * i + q)
    shape = (rows, cfg.train.seq_len)
    return {"inputs": rng.integers(0, cfg.model.vocab_size, shape, dtype=np.int32),
            "targets": rng.integers(0, cfg.model.vocab_size, shape, dtype=np.int32),
            "positions": np.broadcast_to(np.arange(shape[1], dtype=np.int32), shape).copy(),
            "segment_ids": np.ones(shape, np.int32),
            "loss_mask": (rng.random(shape) < 0.7).astype(np.float32)}

  if jax.process_count() == 1:  # the whole group's rows in each global batch
    dataset = [{key: np.concatenate([shard_batch(i, q)[key] for q in range(group)])
                for key in packing.ROW_DTYPES}
               for i in range(group)]
  else:
    q = jax.process_index()
    dataset = [shard_batch(i, q) for i in range(group - q)]
  return loop.evaluate(rt, loop.make_eval_step(rt), params, iter(dataset), max_batches=8)


if __name__ == "__main__":
  compile_cache.enable()  # the group's processes compile each shared program once
  _worker()


def test_gloo_listens_on_the_address_that_reaches_the_coordinator():
  """The source address of the route to the coordinator: loopback for a coordinator on
  this machine (gloo's default is kept then); tests/train/test_two_hosts.py runs two
  hosts with their own addresses."""
  assert distributed.local_address_towards("127.0.0.1:8476") == "127.0.0.1"
  assert distributed.local_address_towards("localhost:8476") in ("127.0.0.1", "::1")


def test_the_peer_watch_names_a_peer_that_stops_answering_and_exits_for_a_resume(capsys):
  """Two peers: one listening (it answers every probe), one whose port closed (a host
  gone): after peer_timeout_s the watch names the lost one only, with the run's resume
  hint, and exits with PEER_LOST_EXIT; bad timeouts are config errors."""
  alive = socket.create_server(("127.0.0.1", 0))
  with socket.create_server(("127.0.0.1", 0)) as closed:
    gone = closed.getsockname()[1]
  settings = distributed.Settings("127.0.0.1:1", 3, 0, 10, peer_timeout_s=1.0)
  watch = distributed.PeerWatch(settings, {1: ("127.0.0.1", alive.getsockname()[1]),
                                           2: ("127.0.0.1", gone)})
  distributed.threading.Thread(target=distributed._answer, args=(alive,), daemon=True).start()
  codes = []
  distributed.PeerWatch.resume_hint = lambda: "The last checkpoint is step 4 in ckpt/."
  try:
    watch.run(exit_fn=codes.append)
  finally:
    distributed.PeerWatch.resume_hint = None
    alive.close()
  assert codes == [distributed.PEER_LOST_EXIT]
  out = capsys.readouterr().out
  assert "lost process 2 at 127.0.0.1: no answer for 1 s" in out and "process 1" not in out
  assert out.rstrip().endswith("stops with status 75. The last checkpoint is step 4 in ckpt/.")
  stopped = distributed.PeerWatch(settings, {2: ("127.0.0.1", gone)})
  stopped.stopped.set()  # stop_peer_watch: the run's last collective is behind it
  stopped.run(exit_fn=codes.append)
  assert codes == [distributed.PEER_LOST_EXIT]
  for key, value in (("heartbeat_timeout_s", 0), ("peer_timeout_s", -1)):
    cfg = distributed.distributed_defaults()
    cfg[key] = value
    with pytest.raises(configlib.ConfigError, match=key):
      distributed.validate(cfg)
