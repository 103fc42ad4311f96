"""`c2jax serve`'s settings: one ConfigDict (configs/serve.py builds on `defaults`), checked
before anything loads.

    cfg = settings.defaults()            # or configs/serve.py:<variant>
    settings.validate(cfg)               # ConfigError naming the key

The command's flags (--model, --port, --slots, ...) are the short form of these fields
(FLAG_FIELDS): a flag given on the command line sets its field, over the config file.
"""

from __future__ import annotations

import ml_collections

from c2jax import config as configlib

# flag -> the field it sets (c2jax/commands/serve.py defines the flags).
FLAG_FIELDS = {
    "model": "model", "served_model_name": "served_model_name", "host": "host",
    "port": "port", "capture": "capture", "slots": "engine.slots",
    "max_length": "engine.max_length", "seed": "engine.seed", "mesh": "engine.mesh",
    "weights_quant": "engine.weights_quant",
    "max_body_mb": "limits.max_body_mb", "api_key": "limits.api_key",
    "follow_weights": "follow.weights", "weight_poll_s": "follow.poll_s",
    "profile_steps": "profile.steps", "profile_dir": "profile.dir",
}


def defaults() -> ml_collections.ConfigDict:
  """One engine of 8 slots x 2,048 tokens on this process's devices, on 127.0.0.1:8000."""
  c = ml_collections.ConfigDict()
  c.task = "serve"
  c.model = ""                 # a c2jax run directory or an HF model directory (required)
  c.served_model_name = ""     # the model id clients send; "" -> the directory's name
  c.host = "127.0.0.1"
  c.port = 8000                # 0 picks a free port
  c.capture = ""               # append per-request token capture JSONL here ("" -> off)

  c.engine = ml_collections.ConfigDict()
  c.engine.slots = 8           # sequences decoded together (KV cache slots)
  c.engine.max_length = 2048   # tokens per sequence, prompt + completion
  c.engine.seed = 0            # seeds requests that send no seed
  # Shard the engine over this process's devices, e.g. "fsdp=8" or "expert=4,tensor=2"
  # (axes data, fsdp, expert, tensor; -1 takes the remaining devices); "" -> one device.
  c.engine.mesh = ""
  # Tokens one decode call may produce: a streamed reply advances once per call, so a
  # server keeps calls short (the engine's own default, for batch work, is 64).
  c.engine.max_decode_steps = 8
  # Hold the routed experts quantised: 'fp8' (128 x 128 block scales), 'int8' or 'int4'
  # (groups along the inputs), dequantised a tile at a time; 'none' keeps the checkpoint's
  # dtype (c2jax.rollout.resident).
  c.engine.weights_quant = "none"
  # An engine over several processes: seconds a program or weight swap may take (its first,
  # compiling call aside) before the server answers 503, names the process holding it up
  # and stops (c2jax.rollout.lockstep.Watchdog).
  c.engine.hang_timeout_s = 600.0

  c.limits = ml_collections.ConfigDict()
  c.limits.max_body_mb = 8.0   # a larger request body is answered 413 before it is read
  # Requests must send 'Authorization: Bearer <key>'; /health stays open.
  # "" -> $C2JAX_API_KEY; neither set: no authentication.
  c.limits.api_key = ""

  # Follow an RL run's published weights (RUN/weights/<run>): newer versions are swapped
  # in between decode steps, every poll_s seconds at most.
  c.follow = ml_collections.ConfigDict()
  c.follow.weights = ""
  c.follow.poll_s = 2.0

  # A jax.profiler trace of engine steps FIRST..LAST (each a decode call over every live
  # request), e.g. "3,5"; written to `dir` ("" -> MODEL/profile/serve).
  c.profile = ml_collections.ConfigDict()
  c.profile.steps = ""
  c.profile.dir = ""
  return c


def validate(cfg: ml_collections.ConfigDict) -> None:
  """Every field present, of its type and in range; raises ConfigError naming the key.
  A config built in Python with an unknown field is refused like a bad override."""
  configlib.check_keys(cfg, defaults())
  if cfg.task != "serve":
    raise configlib.ConfigError("task", f"is {cfg.task!r}; `c2jax serve` takes a "
                                "configs/serve.py config (task 'serve').")
  if not cfg.model:
    raise configlib.ConfigError("model", "is empty; name a c2jax run directory or an HF "
                                "model directory (--model DIR or --config.model=DIR).")
  if not 0 <= cfg.port < 2**16:
    raise configlib.ConfigError("port", f"is {cfg.port}; use 0 (a free port) to 65535.")
  configlib.check_positive(cfg, "engine.slots")
  if cfg.engine.max_length < 2:
    raise configlib.ConfigError("engine.max_length", f"is {cfg.engine.max_length}; a "
                                "sequence needs at least 2 tokens (a prompt and a reply).")
  configlib.check_positive(cfg, "engine.max_decode_steps")
  from c2jax_kernels import weight_quant  # pylint: disable=g-import-not-at-top
  configlib.check_choice(cfg, "engine.weights_quant", weight_quant.WEIGHT_QUANT_CHOICES)
  configlib.check_positive(cfg, "engine.hang_timeout_s")
  configlib.check_positive(cfg, "limits.max_body_mb")
  configlib.check_positive(cfg, "follow.poll_s")
  profile_steps(cfg)
  if cfg.engine.mesh:
    from c2jax.rollout import sharding  # pylint: disable=g-import-not-at-top
    try:
      sharding.check_config(sharding.parse_mesh(cfg.engine.mesh), cfg.engine.slots)
    except ValueError as e:
      raise configlib.ConfigError("engine.mesh", f"{cfg.engine.mesh!r}: {e}") from None


def profile_steps(cfg: ml_collections.ConfigDict) -> tuple[int, int] | None:
  """profile.steps '3,5' -> (3, 5); '' -> None; anything else a ConfigError."""
  text = cfg.profile.steps
  if not text.strip():
    return None
  try:
    first, last = (int(part) for part in text.split(","))
  except ValueError:
    raise configlib.ConfigError("profile.steps", f"is {text!r}; use FIRST,LAST (two engine "
                                "step numbers, e.g. 3,5).") from None
  if not 1 <= first <= last:
    raise configlib.ConfigError("profile.steps", f"is {text!r}; use 1 <= FIRST <= LAST.")
  return first, last
