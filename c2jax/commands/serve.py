"""`c2jax serve`: an OpenAI-compatible server over the JaxEngine.

    c2jax serve --config=configs/serve.py --config.model=runs/sft
    c2jax serve --model runs/sft --port 8000 --slots 8 --capture runs/sft/served.jsonl
    c2jax serve --model runs/sft --mesh fsdp=4,tensor=2   # one engine over 8 local devices

Its settings are one config (configs/serve.py; c2jax/serve/settings.py has the fields and
defaults), like every verb's; the flags are their short form and, when given, win over
the file. Every setting is checked before the model loads.

Endpoints: GET /v1/models, POST /v1/chat/completions (tools, stream, logprobs),
POST /v1/completions, GET /health. --api_key (or $C2JAX_API_KEY) requires
'Authorization: Bearer <key>' on every route but /health; --max_body_mb bounds a request
(docs/serving.md lists every limit). Concurrent requests share one engine (continuous batching over
--slots sequence slots). --capture appends one JSONL line per finished request with the
exact prompt / completion token ids, sampler log-probs, policy versions and expert
indices (c2jax/serve/capture.py), so external agent harnesses' episodes can be trained on.
"""

from __future__ import annotations

import os
import signal
import sys

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Server config (configs/serve.py[:variant]); default: its defaults. "
    "The flags below set the same fields and win over the file.")
_MODEL = flags.DEFINE_string("model", None, "A c2jax run directory or an HF model directory "
                             "(config.model).")
_HOST = flags.DEFINE_string("host", None, "Address to listen on (config.host, 127.0.0.1).")
_PORT = flags.DEFINE_integer("port", None, "Port to listen on, 0 picks a free one "
                             "(config.port, 8000).")
_SLOTS = flags.DEFINE_integer("slots", None, "Sequences decoded together, KV cache slots "
                              "(config.engine.slots, 8).")
_MAX_LENGTH = flags.DEFINE_integer("max_length", None, "Tokens per sequence, prompt + "
                                   "completion (config.engine.max_length, 2048).")
_CAPTURE = flags.DEFINE_string("capture", None, "Append per-request token capture JSONL here "
                               "(config.capture).")
_NAME = flags.DEFINE_string("served_model_name", None, "Model id clients send "
                            "(config.served_model_name; default the directory's name).")
_SEED = flags.DEFINE_integer("seed", None, "Seeds requests that send no seed "
                             "(config.engine.seed, 0).")
_FOLLOW = flags.DEFINE_string("follow_weights", None,
                              "An RL weight directory (RUN/weights/<run>) to follow: newer "
                              "published versions are swapped in between decode steps "
                              "(config.follow.weights).")
_MESH = flags.DEFINE_string("mesh", None, "Shard the engine over this process's devices, "
                            "e.g. 'fsdp=8' or 'expert=4,tensor=2' (axes data, fsdp, expert, "
                            "tensor; -1 takes the remaining devices). Empty: one device "
                            "(config.engine.mesh).")
_WEIGHTS_QUANT = flags.DEFINE_string(
    "weights_quant", None, "Hold the routed experts quantised: none, fp8, int8 or int4, "
    "dequantised a tile at a time in the experts' matmuls (config.engine.weights_quant).")
_POLL = flags.DEFINE_float("weight_poll_s", None, "How often --follow_weights is polled "
                           "(config.follow.poll_s, 2 s).")
_API_KEY = flags.DEFINE_string("api_key", None, "Requests must send 'Authorization: Bearer "
                               "<key>' (the OpenAI clients' api_key); /health stays open. "
                               "Default: $C2JAX_API_KEY; neither set: no authentication "
                               "(config.limits.api_key).")
_MAX_BODY_MB = flags.DEFINE_float("max_body_mb", None, "Largest request body accepted, in "
                                  "MiB; a larger one is answered 413 before it is read "
                                  "(config.limits.max_body_mb, 8).")
_PROFILE_STEPS = flags.DEFINE_string(
    "profile_steps", None, "FIRST,LAST: a jax.profiler trace of these engine steps (each a "
    "decode call over every live request), for TensorBoard's profile plugin or Perfetto "
    "(config.profile.steps).")
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", None, "Where --profile_steps writes its trace. Default: "
    "MODEL/profile/serve when --model is a local directory (config.profile.dir).")

USAGE = ("usage: c2jax serve --model RUN_OR_HF_DIR [--host H --port N --slots N "
         "--max_length N --mesh AXIS=SIZE,...]\n"
         "   or: c2jax serve --config=configs/serve.py[:variant] --config.model=DIR "
         "[--config.<key>=<value> ...]")


def settings_from_flags():
  """The server's settings: --config (or settings.defaults()), then each flag given on the
  command line over its field (settings.FLAG_FIELDS)."""
  from c2jax import config as configlib  # pylint: disable=g-import-not-at-top
  from c2jax.serve import settings  # pylint: disable=g-import-not-at-top

  cfg = settings.defaults() if _CONFIG.value is None else _CONFIG.value
  for flag, field in settings.FLAG_FIELDS.items():
    if flags.FLAGS[flag].present:
      group, _, key = field.rpartition(".")
      (configlib.get(cfg, group) if group else cfg)[key] = flags.FLAGS[flag].value
  return cfg


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    print(f"c2jax serve: unexpected arguments {argv[1:]}.\n{USAGE}", file=sys.stderr)
    return 2
  from c2jax import config as configlib  # pylint: disable=g-import-not-at-top
  from c2jax.serve import settings  # pylint: disable=g-import-not-at-top

  cfg = settings_from_flags()
  try:
    settings.validate(cfg)
  except configlib.ConfigError as e:
    print(f"c2jax serve: {e}\n{USAGE}", file=sys.stderr)
    return 2
  profile_steps = settings.profile_steps(cfg)
  profile_dir = cfg.profile.dir
  if profile_steps is not None and not profile_dir:
    if not os.path.isdir(cfg.model):
      print("c2jax serve: --profile_steps (config.profile.steps) needs --profile_dir "
            "(config.profile.dir) when the model is not a local directory.", file=sys.stderr)
      return 2
    profile_dir = os.path.join(cfg.model, "profile", "serve")
  # Heavy imports after the settings are checked, so a typo fails fast.
  from c2jax.parallel import distributed  # pylint: disable=g-import-not-at-top
  from c2jax.rollout import JaxEngine, jax_engine, lockstep, resident, sharding  # pylint: disable=g-import-not-at-top
  from c2jax.serve import (app, auth, loading, server,  # pylint: disable=g-import-not-at-top
                           validation)
  from c2jax.train import profiling  # pylint: disable=g-import-not-at-top
  mesh = sharding.parse_mesh(cfg.engine.mesh) if cfg.engine.mesh else None
  # Several processes (JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, or a
  # SLURM step, a TPU VM slice): one engine over all their devices; process 0 serves.
  distributed.initialize(distributed.distributed_defaults())
  try:
    loaded = loading.load(cfg.model, weights_quant=cfg.engine.weights_quant)
    engine = JaxEngine(loaded.cfg, loaded.params, num_slots=cfg.engine.slots,
                       max_length=cfg.engine.max_length, version=loaded.version,
                       detokenize=loaded.tokenizer.decode, seed=cfg.engine.seed,
                       parallel=mesh, max_decode_steps=cfg.engine.max_decode_steps,
                       decode_steps=min(cfg.engine.max_decode_steps,
                                        jax_engine.DEFAULT_DECODE_STEPS),
                       weights_quant=cfg.engine.weights_quant,
                       hang_timeout_s=cfg.engine.hang_timeout_s)
  except (FileNotFoundError, ValueError) as e:
    print(f"c2jax serve: {e}", file=sys.stderr)
    return 2
  stored = resident.held_schemes(loaded.params)
  if stored:
    print(f"c2jax serve: {cfg.model}'s routed experts are held as stored "
          f"({'/'.join(stored)}), not dequantised and quantised again", flush=True)
  if not engine.is_leader:
    return _follow(engine, cfg)
  spread = engine.placement is not None and lockstep.spans_processes(engine.placement.mesh)
  if engine.placement is not None:
    mesh = engine.placement.mesh
    print(f"c2jax serve: engine over {mesh.devices.size} devices, mesh "
          f"{ {axis: size for axis, size in mesh.shape.items() if size > 1} }", flush=True)
  service = app.Service(engine, loaded.tokenizer, cfg.served_model_name or loaded.name,
                        vocab_size=loaded.cfg.vocab_size, capture_path=cfg.capture or None,
                        limits=validation.Limits(
                            max_body_bytes=int(cfg.limits.max_body_mb * 2**20)),
                        api_key=auth.resolve_key(cfg.limits.api_key or None),
                        trace=profiling.StepTrace(profile_steps, profile_dir or "."),
                        on_fatal=_stop_on_engine_failure if spread else None)
  if spread:
    # A program that never completes (a process stuck elsewhere): 503s, then the stop.
    engine.on_hang = service.loop.fail
    # uvicorn re-raises a SIGTERM once it has shut down: as an exception it reaches the
    # `finally` below, which stops the followers before this process, which holds the
    # job's coordination service, exits.
    signal.signal(signal.SIGTERM, _exit_on_signal)
  follower = None
  if cfg.follow.weights:
    from c2jax.serve import follow  # pylint: disable=g-import-not-at-top
    follower = follow.WeightFollower(engine, cfg.follow.weights, cfg.follow.poll_s).start()
  try:
    server.serve_forever(service, cfg.host, cfg.port)
  except SystemExit:
    if not _FAILED:
      raise
  finally:
    if follower is not None:
      follower.stop()
    if not _FAILED:
      engine.stop_followers()
  if _FAILED:
    # JAX's exit would wait at the distributed shutdown barrier for the lost process.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # pylint: disable=protected-access
  return 0


# What failed of an engine over several processes (set on its engine thread).
_FAILED: list[str] = []


def _stop_on_engine_failure(error: Exception) -> None:
  """An engine over several processes failed a program: a process is gone (its
  collectives fail). Live and later requests get 503; the server stops, naming the
  processes that no longer answer, and exits non-zero."""
  import jax  # pylint: disable=g-import-not-at-top

  from c2jax.parallel import distributed  # pylint: disable=g-import-not-at-top

  from c2jax.rollout import lockstep  # pylint: disable=g-import-not-at-top

  if isinstance(error.__cause__, lockstep.EngineHang):  # its message names the processes
    _FAILED.append(", ".join(f"process {rank}" for rank in error.__cause__.processes))
    print(f"c2jax serve: {error.__cause__}; stopping.", file=sys.stderr, flush=True)
  else:
    lost = distributed.unreachable_peers()
    named = ", ".join(f"process {rank}" for rank in lost) or "a process (none named)"
    _FAILED.append(named)
    print(f"c2jax serve: the engine over {jax.process_count()} processes failed: {named} "
          f"no longer answers ({error}); stopping.", file=sys.stderr, flush=True)
  os.kill(os.getpid(), signal.SIGTERM)


def _exit_on_signal(signum, frame) -> None:
  del frame
  raise SystemExit(1 if _FAILED else 128 + signum)


def _follow(engine, cfg) -> int:
  """A process other than 0 of a server over several processes: no port; it runs the
  engine programs process 0 runs until process 0 stops, loading swapped weights from
  --follow_weights by version."""
  import jax  # pylint: disable=g-import-not-at-top

  from c2jax.rollout import weights as weights_lib  # pylint: disable=g-import-not-at-top

  subscriber = weights_lib.WeightSubscriber(cfg.follow.weights) if cfg.follow.weights else None
  print(f"c2jax serve: process {jax.process_index()} of {jax.process_count()} follows "
        "process 0's engine (process 0 serves HTTP)", flush=True)
  engine.follow(None if subscriber is None else lambda version: subscriber.load(version))
  return 0
