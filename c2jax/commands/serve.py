"""`c2jax serve --model RUN_OR_HF_DIR`: an OpenAI-compatible server over the JaxEngine.

    c2jax serve --model runs/sft --port 8000 --slots 8 --capture runs/sft/served.jsonl
    c2jax serve --model runs/sft --mesh fsdp=4,tensor=2   # one engine over 8 local devices

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
import sys

from absl import flags

_MODEL = flags.DEFINE_string("model", None, "A c2jax run directory or an HF model directory.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on (0 picks a free one).")
_SLOTS = flags.DEFINE_integer("slots", 8, "Sequences decoded together (KV cache slots).")
_MAX_LENGTH = flags.DEFINE_integer("max_length", 2048,
                                   "Tokens per sequence (prompt + completion).")
_CAPTURE = flags.DEFINE_string("capture", None, "Append per-request token capture JSONL here.")
_NAME = flags.DEFINE_string("served_model_name", None,
                            "Model id clients send (default: the directory's name).")
_SEED = flags.DEFINE_integer("seed", 0, "Seeds requests that send no seed.")
_FOLLOW = flags.DEFINE_string("follow_weights", None,
                              "An RL weight directory (RUN/weights/<run>) to follow: newer "
                              "published versions are swapped in between decode steps.")
_MESH = flags.DEFINE_string("mesh", "", "Shard the engine over this process's devices, "
                            "e.g. 'fsdp=8' or 'expert=4,tensor=2' (axes data, fsdp, expert, "
                            "tensor; -1 takes the remaining devices). Empty: one device.")
_POLL = flags.DEFINE_float("weight_poll_s", 2.0, "How often --follow_weights is polled.")
_API_KEY = flags.DEFINE_string("api_key", None, "Requests must send 'Authorization: Bearer "
                               "<key>' (the OpenAI clients' api_key); /health stays open. "
                               "Default: $C2JAX_API_KEY; neither set: no authentication.")
_MAX_BODY_MB = flags.DEFINE_float("max_body_mb", 8.0, "Largest request body accepted, in "
                                  "MiB; a larger one is answered 413 before it is read.")

_PROFILE_STEPS = flags.DEFINE_string(
    "profile_steps", "", "FIRST,LAST: a jax.profiler trace of these engine steps (each a "
    "decode call over every live request), for TensorBoard's profile plugin or Perfetto.")
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", None, "Where --profile_steps writes its trace. Default: "
    "MODEL/profile/serve when --model is a local directory.")

USAGE = ("usage: c2jax serve --model RUN_OR_HF_DIR [--host H --port N --slots N "
         "--max_length N --mesh AXIS=SIZE,...]")


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    print(f"c2jax serve: unexpected arguments {argv[1:]}.\n{USAGE}", file=sys.stderr)
    return 2
  if not _MODEL.value:
    print(f"c2jax serve: --model is required.\n{USAGE}", file=sys.stderr)
    return 2
  if not _MAX_BODY_MB.value > 0:
    print(f"c2jax serve: --max_body_mb = {_MAX_BODY_MB.value}; use a positive size.",
          file=sys.stderr)
    return 2
  if _SLOTS.value < 1 or _MAX_LENGTH.value < 2:
    print(f"c2jax serve: --slots = {_SLOTS.value} and --max_length = {_MAX_LENGTH.value}; "
          "use at least 1 slot and 2 tokens.", file=sys.stderr)
    return 2
  try:
    profile_steps = _profile_steps(_PROFILE_STEPS.value)
  except ValueError as e:
    print(f"c2jax serve: --profile_steps {_PROFILE_STEPS.value!r}: {e}", file=sys.stderr)
    return 2
  profile_dir = _PROFILE_DIR.value
  if profile_steps is not None and not profile_dir:
    if not os.path.isdir(_MODEL.value):
      print("c2jax serve: --profile_steps needs --profile_dir when --model is not a local "
            "directory.", file=sys.stderr)
      return 2
    profile_dir = os.path.join(_MODEL.value, "profile", "serve")
  # Heavy imports after the flags are checked, so a typo fails fast.
  from c2jax.rollout import JaxEngine, jax_engine, sharding  # pylint: disable=g-import-not-at-top
  from c2jax.serve import (app, auth, loading, server,  # pylint: disable=g-import-not-at-top
                           validation)
  from c2jax.train import profiling  # pylint: disable=g-import-not-at-top
  try:
    mesh = sharding.parse_mesh(_MESH.value) if _MESH.value else None
    if mesh is not None:
      sharding.check_config(mesh, _SLOTS.value)
  except ValueError as e:
    print(f"c2jax serve: --mesh {_MESH.value!r}: {e}", file=sys.stderr)
    return 2
  try:
    loaded = loading.load(_MODEL.value)
    # Streamed replies advance once per decode call: keep calls at the short chunk.
    engine = JaxEngine(loaded.cfg, loaded.params, num_slots=_SLOTS.value,
                       max_length=_MAX_LENGTH.value, version=loaded.version,
                       detokenize=loaded.tokenizer.decode, seed=_SEED.value, parallel=mesh,
                       max_decode_steps=jax_engine.DEFAULT_DECODE_STEPS)
  except (FileNotFoundError, ValueError) as e:
    print(f"c2jax serve: {e}", file=sys.stderr)
    return 2
  if engine.placement is not None:
    mesh = engine.placement.mesh
    print(f"c2jax serve: engine over {mesh.devices.size} devices, mesh "
          f"{ {axis: size for axis, size in mesh.shape.items() if size > 1} }", flush=True)
  service = app.Service(engine, loaded.tokenizer, _NAME.value or loaded.name,
                        vocab_size=loaded.cfg.vocab_size, capture_path=_CAPTURE.value,
                        limits=validation.Limits(
                            max_body_bytes=int(_MAX_BODY_MB.value * 2**20)),
                        api_key=auth.resolve_key(_API_KEY.value),
                        trace=profiling.StepTrace(profile_steps, profile_dir or "."))
  follower = None
  if _FOLLOW.value:
    from c2jax.serve import follow  # pylint: disable=g-import-not-at-top
    follower = follow.WeightFollower(engine, _FOLLOW.value, _POLL.value).start()
  try:
    server.serve_forever(service, _HOST.value, _PORT.value)
  finally:
    if follower is not None:
      follower.stop()
  return 0


def _profile_steps(text: str) -> tuple[int, int] | None:
  """'3,5' -> (3, 5); '' -> None. (The flag's own wording of profiling.steps_of's check.)"""
  if not text.strip():
    return None
  try:
    first, last = (int(part) for part in text.split(","))
  except ValueError:
    raise ValueError("use FIRST,LAST (two engine step numbers, e.g. 3,5).") from None
  if not 1 <= first <= last:
    raise ValueError("use 1 <= FIRST <= LAST.")
  return first, last
