"""No file of the repository names a path of one particular machine.

A default such as a home directory's venv or a scratch folder under /tmp works on the
machine it was written on and silently differs (or skips) everywhere else. Paths that
are the same on every Linux machine stay allowed: `/usr/bin/env`, `/proc`, the sandbox's
private `/tmp` (and its dot-files), `~/.cache/...` (the user's own home).
"""

import pathlib
import re
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# A machine path: the work tree or root's home (/work/..., /root/...), a user's home
# (/home/<user>/..., /Users/<user>/...) or a named folder under /tmp; only when the slash
# starts the path (not `runs/tmp/x`, not a URL's path).
MACHINE_PATH = re.compile(
    r"(?<![\w.~/-])/(?:(?:work|root)/[\w.]|(?:home|Users)/[\w.-]+/|tmp/[A-Za-z0-9_])")
# This file states the rule with examples of what it refuses.
SELF = pathlib.Path(__file__).resolve().relative_to(REPO).as_posix()


def machine_paths(text: str) -> list[tuple[int, str]]:
  """(line number, line) of every line of `text` that names a machine path."""
  return [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1)
          if MACHINE_PATH.search(line)]


@pytest.mark.parametrize("line", [
    'TORCH_PYTHON = os.environ.get("C2JAX_TORCH_PYTHON", "/work/venvs/py311/bin/python")',
    "  /work/venv311/bin/python tools/fixtures/hf_logits.py HF_DIR TOKENS.npy OUT.npy",
    "parser.add_argument('--root', default='/tmp/quant_training')",
    "--init-from /work/runs/tiny/sft --tasks 8",
    'cache = "/root/.cache/c2jax"',
    "data in /home/alice/corpus",
    "see /Users/bob/runs/x",
])
def test_the_rule_refuses_a_machine_path(line):
  assert machine_paths(line) == [(1, line.strip())]


@pytest.mark.parametrize("line", [
    "#!/usr/bin/env bash",
    "options += ['--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp']",
    "'HOME': '/tmp',",
    "[ -e /tmp/.egress-ready ] && break",
    'location = os.environ.get("C2JAX_XLA_CACHE", "~/.cache/c2jax/xla")',
    "f'cat {host_secret}/secret.txt; ls /root /home /work; cat /etc/shadow; '",
    "c2jax sweep experiments/sweeps/fig2_chain.py:test --workdir=runs/fig2_chain --dry_run",
    "https://example.com/work/x and runs/tmp/y",
])
def test_the_rule_allows_paths_every_machine_has(line):
  assert machine_paths(line) == []


def test_no_tracked_file_names_a_machine_path():
  listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                          text=True, check=False)
  if listed.returncode:
    pytest.skip(f"not a git checkout ({listed.stderr.strip()}): no tracked files to scan")
  offenders = []
  for name in filter(None, listed.stdout.split("\0")):
    path = REPO / name
    if name == SELF or path.is_symlink() or not path.is_file():
      continue
    data = path.read_bytes()
    if b"\0" in data[:8192]:  # binary: weights, arrays, images
      continue
    offenders += [f"{name}:{number}: {line[:120]}"
                  for number, line in machine_paths(data.decode("utf-8", "replace"))]
  assert not offenders, (
      "paths of one machine in tracked files; use a path relative to the repository "
      "(runs/...), ~/..., tempfile.gettempdir(), or $C2JAX_TORCH_PYTHON for the torch "
      "interpreter:\n" + "\n".join(offenders))
