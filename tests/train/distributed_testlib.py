"""The 2-process pretraining runs of the jax.distributed tests (2 CPU processes x 2 fake
devices over loopback): their settings and how they are started."""

import socket
import subprocess

from tests.subprocess_checks import child_env
from train_testlib import REPO, job_command

PRETRAIN = "configs/pretrain.py:tiny"
# Enough steps after the latest signal (step 4) for the processes to agree on a sync point
# (a step or two after it), and no more: a step here is a Gloo collective between two CPU
# processes, about a quarter of a second on a quiet machine.
STEPS = 14
# The tiny model cut to its one MoE layer: many processes compile it, and each step is a
# collective between the two.
ARGS = (f"--config.train.steps={STEPS}", "--config.train.checkpoint_every=10",
        "--config.train.eval_every=0", "--config.model.num_layers=1",
        "--config.model.first_k_dense=0")


def pair_env(**extra) -> dict:
  return child_env(XLA_FLAGS="--xla_force_host_platform_device_count=2", **extra)


def free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def start_pair(workdir, data_cache, *extra, verb="pretrain", config=PRETRAIN
               ) -> list[subprocess.Popen]:
  port = free_port()
  args = ARGS if verb == "pretrain" else ()
  return [subprocess.Popen(
      job_command(verb, config, workdir, data_cache, *args, *extra), cwd=REPO,
      env=pair_env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=2,
                   JAX_PROCESS_ID=rank),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]


def finish(procs, timeout_s=600) -> list[tuple[int, str, str]]:
  results = []
  for proc in procs:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err[-4000:]
    results.append((proc.returncode, out, err))
  return results
