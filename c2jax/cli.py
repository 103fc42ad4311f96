"""The `c2jax` command: `c2jax <verb> [flags]`.

Each verb lives in its own module under c2jax/commands/ (one place for every verb), which
defines its absl flags at import time and a `main(argv) -> int`; only the chosen verb's module is imported, so verbs never clash over
flag names. Configs are ml-collections files: `--config=configs/<file>.py:<arg>` plus any
`--config.<key>=<value>` overrides (unknown keys and wrong types are rejected by absl).
"""

from __future__ import annotations

import importlib
import sys

from absl import app, flags, logging

from c2jax import compile_cache
from c2jax.verbs import VERBS


def usage() -> str:
  lines = ["usage: c2jax <verb> [--flags]", "", "verbs:"]
  lines += [f"  {verb:<10} {doc}" for verb, (_, doc) in VERBS.items()]
  lines.append("\n`c2jax <verb> --help` lists a verb's flags.")
  return "\n".join(lines)


def run(argv: list[str] | None = None) -> None:
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(usage())
    sys.exit(0 if len(argv) >= 2 else 2)
  verb = argv[1]
  if verb not in VERBS:
    print(f"c2jax: unknown verb {verb!r}.\n\n{usage()}", file=sys.stderr)
    sys.exit(2)
  module = importlib.import_module(VERBS[verb][0])
  if any(arg in ("-h", "--help", "--helpshort") for arg in argv[2:]):
    # absl's own help lists only the main module's flags, which are not the verb's.
    print(f"c2jax {verb}: {(module.__doc__ or VERBS[verb][1]).strip()}\n")
    print(flags.FLAGS.module_help(module.__name__))
    sys.exit(0)
  compile_cache.enable()  # persist compiled programs across runs and processes
  rest = argv[2:]
  quiet = not any(arg.startswith(("--verbosity", "-v")) for arg in rest)

  def main(verb_argv):
    # app.run turns on INFO logs (orbax, JAX backend probing); keep warnings only unless
    # the user asked for --verbosity.
    if quiet:
      logging.set_verbosity(logging.WARNING)
    from c2jax import config as configlib
    from c2jax import host_memory

    host_memory.retain_freed_memory()  # before the first large XLA buffer

    try:
      return module.main(verb_argv)
    except configlib.ConfigError as err:  # a config mistake is the user's to fix: no traceback
      print(f"c2jax {verb}: {err}", file=sys.stderr)
      return 2

  app.run(main, argv=[f"c2jax {verb}"] + rest)


if __name__ == "__main__":
  run()
