"""c2jax.serve: an OpenAI-compatible HTTP server over the rollout engine, with token capture.

    c2jax serve --model RUN_OR_HF_DIR --port 8000 [--capture served.jsonl]

In Python (tests, benchmarks, notebooks):

    service = serve.Service(engine, tokenizer, "my-model", vocab_size=cfg.vocab_size,
                            capture_path="served.jsonl")
    with serve.Running(service) as running:          # a free port on 127.0.0.1
      client = openai.OpenAI(base_url=running.base_url, api_key="unused")

Pieces: engine_loop (one thread owns the engine: continuous batching), app / endpoints
(FastAPI routes), schema (request bodies, OpenAI error body), prompts (messages + tools ->
token ids, as the agent renders them), output (token ids -> content, tool_calls, stream
deltas), capture (token-exact JSONL for RL), loading (run or HF directory), server
(uvicorn), validation (limits checked before work starts), auth (--api_key), completions
(several choices, legacy log-probs), tokenizer_routes (/tokenize, /detokenize). The
limits and features are documented in docs/serving.md.
"""

import importlib

# Loaded on first use: FastAPI and pydantic take most of a second to import, and RL actors
# and the agent harness import c2jax.serve.capture without serving anything.
_EXPORTS = {"Service": ("app", "Service"), "read_capture": ("capture", "read"),
            "create_app": ("endpoints", "create_app"), "Running": ("server", "Running")}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'c2jax.serve' has no attribute {name!r}")
  module, attr = _EXPORTS[name]
  return getattr(importlib.import_module(f"c2jax.serve.{module}"), attr)
