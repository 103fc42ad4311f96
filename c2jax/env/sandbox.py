"""Sandboxes by backend name: `make_sandbox`, `make_task_sandbox`, `backends`.

A sandbox is an isolated copy of a repository (the workspace, mounted at `WORKDIR`
inside) in which commands run with no network and bounded time, memory, processes and
output. File access from the host goes through `read_file`/`write_file`/`list_files`,
whose paths are relative to the workspace and may never leave it. The interface
(`Sandbox`, `ExecResult`, the errors, `WORKDIR`) is defined in sandbox_base.py, which the
backends build on, and is re-exported here.
"""

from absl import logging

# pylint: disable=unused-import
from c2jax.env import bubblewrap  # registers 'bubblewrap'
from c2jax.env import toolchains
from c2jax.env.sandbox_base import (BASE_ENVIRONMENT, WORKDIR, ExecResult,
                                    PathOutsideWorkspaceError, Sandbox, SandboxError,
                                    SandboxFactory, command_environment, normalize_relpath,
                                    register_backend)
from c2jax.env.sandbox_base import BACKENDS  # by name, filled as backends are imported
# pylint: enable=unused-import

_WARNED_UNBUILT: set[str] = set()  # ids of tasks whose unbuilt Dockerfile was warned of


def backends() -> list[str]:
  _import_backends()
  return sorted(BACKENDS)


def _import_backends():
  # Backends register themselves on import. The docker backend is imported on first use
  # only: the docker SDK takes ~0.3 s to import and most runs use bubblewrap.
  from c2jax.env import docker_backend  # pylint: disable=g-import-not-at-top,unused-import


def make_task_sandbox(backend: str, task, **limits) -> Sandbox:
  """A sandbox over `task.repo`, starting from the task's environment layer if it has one
  (a venv made by `c2jax tasks install`; bubblewrap only). A bubblewrap sandbox of a task
  in another language (task.language: Go, Rust, node) also sees that language's
  toolchain where it lives outside /usr (rustup's, under the home folder). On the docker
  backend such a task (and a Python task with a layer) starts from its environment
  image instead (c2jax.env.env_images: the sandbox image plus the host's toolchain or
  the layer and its interpreter), unless the caller names an image.

  A task with a docker image (task.image: its Terminal-Bench / Harbor Dockerfile, built by
  c2jax.env.images) starts from that image on the docker backend, its workspace the
  image's WORKDIR (task.repo is not copied in; the image wins over an `image=` limit);
  other backends cannot start from an image and refuse it. A task whose Dockerfile was
  not built (task.dockerfile without task.image) runs as before, in a copy of task.repo
  with the sandbox's own tools, and a warning says so once per task."""
  if getattr(task, 'image', ''):
    if backend != 'docker':
      raise ValueError(f'Task {task.id!r} runs in the docker image {task.image} built from '
                       f'{task.dockerfile}, which the {backend!r} backend cannot start; use '
                       "backend 'docker', or load the task folder without building its image.")
    return make_sandbox('docker', None, **dict(limits, image=task.image))
  if getattr(task, 'dockerfile', '') and task.id not in _WARNED_UNBUILT:
    _WARNED_UNBUILT.add(task.id)
    logging.warning(
        'Task %s has a Dockerfile (%s) that was not built: its %s sandboxes are a copy of %s '
        'with the sandbox image\'s own tools, and what the Dockerfile installs or copies is '
        'missing. To run it as its benchmark does, load it with build_images (c2jax eval: '
        '--config.agent.backend=docker --config.suite.args.build_images=true).',
        task.id, task.dockerfile, backend, task.repo)
  if backend == 'docker' and 'image' not in limits:
    # The task's toolchain (or venv layer) in an environment image, built once.
    from c2jax.env import env_images  # pylint: disable=g-import-not-at-top

    tag = env_images.image_for(task)
    if tag:
      return make_sandbox(backend, task.repo, **dict(limits, image=tag))
  if getattr(task, 'environment', ''):
    if backend != 'bubblewrap':
      raise ValueError(f'Task {task.id!r} runs in the environment layer {task.environment}, '
                       f'which only the bubblewrap backend can mount; use backend '
                       f"'bubblewrap' (not {backend!r}).")
    limits['env_layer'] = task.environment
  elif getattr(task, 'language', '') and backend == 'bubblewrap' and 'ro_binds' not in limits:
    toolchain = toolchains.binds(task.language)
    defaults = bubblewrap.default_ro_binds()
    limits['ro_binds'] = defaults + tuple(p for p in toolchain if p not in defaults)
  return make_sandbox(backend, task.repo, **limits)


def make_sandbox(backend: str, repo: str | None, **limits) -> Sandbox:
  """Starts a sandbox over a copy of `repo` (a host folder) with the given limits.

  Backend options other than limits (e.g. `image=` for docker) pass through too. The
  docker backend also takes repo None: the workspace is then what the image holds.
  """
  _import_backends()
  if backend not in BACKENDS:
    raise ValueError(
        f'Unknown sandbox backend {backend!r}; choose one of {sorted(BACKENDS)}.')
  return BACKENDS[backend](repo, **limits)
