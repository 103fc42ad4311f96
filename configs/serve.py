"""`c2jax serve`: an OpenAI-compatible server over the engine, every setting in one file.

  c2jax serve --config=configs/serve.py --config.model=runs/sft
  c2jax serve --config=configs/serve.py:long --config.model=runs/sft --config.capture=served.jsonl
  c2jax serve --config=configs/serve.py --config.model=runs/sft --config.engine.mesh=fsdp=4,tensor=2

The fields and their defaults are c2jax/serve/settings.py's `defaults`. The command's
flags are their short form and win over the file when both are given:
`c2jax serve --model runs/sft --port 8001` is these defaults with `model` and `port` set.
docs/serving.md lists every limit.

Variants (the `:arg`):
  ""      one engine of 8 slots x 2,048 tokens on this process's devices
  long    external agent harnesses: 4 slots x 32,768 tokens (a long episode per slot)
"""

from c2jax.serve import settings

TEST_ARGS = ("", "long")


def get_config(arg: str = ""):
  c = settings.defaults()
  variant = arg or ""
  if variant == "long":
    c.engine.slots, c.engine.max_length = 4, 32768
  elif variant:
    raise ValueError(f"configs/serve.py: unknown variant {variant!r}; use '' or 'long'.")
  return c
