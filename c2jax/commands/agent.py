"""`c2jax agent step --repo DIR`: run one model turn's tool calls in a sandbox.

Reads a model turn in the tool-call protocol (c2jax.toolcalls.protocol) on standard input,
runs its calls in a fresh sandbox over a copy-on-write view of DIR (DIR itself is never
changed) and prints one JSON object per observation: {"index", "name", "ok", "output"}.
Exits 0 when every call succeeded, 1 otherwise.
"""

import dataclasses
import json
import sys

from absl import flags

from c2jax.env import sandbox as sandbox_lib
from c2jax.env import tools as tools_lib

_REPO = flags.DEFINE_string('repo', None, 'Repository folder the sandbox starts from.')
_BACKEND = flags.DEFINE_string('backend', 'bubblewrap', 'Sandbox backend.')
_TOOLS = flags.DEFINE_list('tools', list(tools_lib.ToolsetConfig.tools),
                           'Tools offered (comma-separated).')
_STRICT = flags.DEFINE_boolean('strict', True, 'Reject unknown or wrong-typed arguments.')

USAGE = 'usage: c2jax agent step --repo DIR < turn.txt'


def main(argv: list[str]) -> int:
  if len(argv) != 2 or argv[1] != 'step':
    print(f'c2jax agent: expected the sub-command "step".\n{USAGE}', file=sys.stderr)
    return 2
  if not _REPO.value:
    print(f'c2jax agent step: --repo is required.\n{USAGE}', file=sys.stderr)
    return 2
  config = tools_lib.ToolsetConfig(tools=tuple(_TOOLS.value), strict=_STRICT.value)
  turn_bytes = sys.stdin.buffer.read()
  with sandbox_lib.make_sandbox(_BACKEND.value, _REPO.value) as sandbox:
    _, observations = tools_lib.Toolbox(sandbox, config).run_turn(turn_bytes)
  for observation in observations:
    print(json.dumps(dataclasses.asdict(observation)))
  return 0 if all(o.ok for o in observations) else 1


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  app.run(main)
