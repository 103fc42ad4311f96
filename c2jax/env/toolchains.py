"""The host folders a language's toolchain needs inside a bubblewrap sandbox.

    toolchains.binds('rust')   # (rustc's sysroot under ~/.rustup,) or () under /usr

A sandbox always sees /usr; a toolchain installed elsewhere (rustup's under the home
folder, a node from nvm) is bound read-only at its own path, so both the task builder
(c2jax.env.languages) and every sandbox of a built task (sandbox.make_task_sandbox) run
the same compiler. A leaf module: the sandboxes and the languages both import it.
"""

from __future__ import annotations

import os
import shutil
import subprocess


def program_binds(name: str) -> tuple[str, ...]:
  """The host folder a toolchain program needs bound in a sandbox: none when it lives
  under /usr (always visible), else its installation prefix (the parent of its bin/,
  which then comes first on the sandbox's PATH)."""
  found = shutil.which(name)
  if found is None:
    raise RuntimeError(f'{name} is not installed; install it to build or run tasks in '
                       'its language.')
  real = os.path.realpath(found)
  return () if real.startswith('/usr/') else (os.path.dirname(os.path.dirname(real)),)


def rust_binds() -> tuple[str, ...]:
  """rustc's sysroot (cargo, rustc and the standard library) unless it is under /usr."""
  try:
    sysroot = subprocess.run(['rustc', '--print', 'sysroot'], capture_output=True,
                             text=True, check=True).stdout.strip()
  except (FileNotFoundError, subprocess.CalledProcessError) as e:
    raise RuntimeError('rustc is not installed (or broken): install a toolchain with '
                       'rustup to build or run Rust tasks.') from e
  return () if sysroot.startswith('/usr') else (sysroot,)


_BINDS = {'go': lambda: program_binds('go'), 'node': lambda: program_binds('node'),
          'rust': rust_binds, 'python': lambda: ()}


def binds(language: str) -> tuple[str, ...]:
  """The toolchain folders of `language` ('go', 'rust', 'node'; 'python': none beyond
  the sandbox's defaults)."""
  if language not in _BINDS:
    raise ValueError(f'No toolchain known for language {language!r}; one of '
                     f'{sorted(_BINDS)}.')
  return _BINDS[language]()
