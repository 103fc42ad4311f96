"""`c2jax sandbox exec --repo DIR [--timeout S] [--memory MB] [--cpus N] [--disk MB] -- CMD...`

Runs one command in a fresh sandbox over a copy-on-write view of DIR (DIR itself is
never changed), prints its output on stdout and its exit status on stderr, and exits
with the command's status (124 when it timed out, like `timeout`). `--disk` bounds what
the command may write in all (sandbox Limits.disk_mb): past it, writes fail with ENOSPC.
"""

import sys

from absl import flags

from c2jax.env import sandbox as sandbox_lib

_REPO = flags.DEFINE_string('repo', None, 'Repository folder the sandbox starts from.')
_TIMEOUT = flags.DEFINE_float('timeout', 60.0, 'Wall-clock limit in seconds.')
_MEMORY = flags.DEFINE_integer('memory', 1024, 'Memory limit in MB.')
_CPUS = flags.DEFINE_float('cpus', 1.0, 'CPU limit in cores (CPU time per wall time).')
_DISK = flags.DEFINE_integer('disk', 1024, 'Disk quota in MB: what the command may write '
                             'in all (the workspace and /tmp).')
_BACKEND = flags.DEFINE_string('backend', 'bubblewrap', 'Sandbox backend.')

USAGE = ('usage: c2jax sandbox exec --repo DIR [--timeout S] [--memory MB] [--cpus N] '
         '[--disk MB] [--backend bubblewrap|docker] -- CMD...')


def main(argv: list[str]) -> int:
  if len(argv) < 2 or argv[1] != 'exec':
    print(f'c2jax sandbox: expected the sub-command "exec".\n{USAGE}', file=sys.stderr)
    return 2
  command = argv[2:]
  if not command:
    print(f'c2jax sandbox exec: no command given after --.\n{USAGE}', file=sys.stderr)
    return 2
  if not _REPO.value:
    print(f'c2jax sandbox exec: --repo is required.\n{USAGE}', file=sys.stderr)
    return 2
  with sandbox_lib.make_sandbox(_BACKEND.value, _REPO.value, timeout_s=_TIMEOUT.value,
                                memory_mb=_MEMORY.value, cpus=_CPUS.value,
                                disk_mb=_DISK.value) as sandbox:
    result = sandbox.exec(command)
  sys.stdout.buffer.write(result.output)
  sys.stdout.flush()
  notes = (' (timed out)' if result.timed_out else '') + (
      ' (output limit reached)' if result.truncated else '')
  print(f'exit status: {result.exit_code}{notes}', file=sys.stderr)
  if result.timed_out:
    return 124
  return result.exit_code if result.exit_code >= 0 else 128 - result.exit_code


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  app.run(main)
