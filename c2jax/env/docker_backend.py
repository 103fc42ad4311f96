"""Docker sandbox backend, through the `docker` Python SDK: one container per sandbox.

The repository is copied into /workspace of a container made from `image` (which must
provide /bin/sh, `timeout` and the tools the tasks need, e.g. `python:3.12-slim` plus
pytest), then committed as the base snapshot image. Limits map to the engine's own:
HostConfig Memory/MemorySwap (no swap), PidsLimit, NetworkMode 'none'; wall time and
clean-up are enforced by wrapping each command in `timeout -s KILL` followed by
`kill -9 -1` (every process but the container's init), output by reading at most
Limits.max_output_bytes. `snapshot` commits the container, `fork` starts a new
container from that image, `reset` replaces the container with one from the base image.
Environment: a command sees the image's ENV overridden by `sandbox.BASE_ENVIRONMENT`
(set on the container at creation), nothing of the launching process's: the SDK talks to
the engine over its API and passes no variables of its own. Every exec of a sandbox runs
in the one container, so a command sees the container's process 1 (`sleep infinity`,
which keeps the container alive between commands and has the same environment) and any
other command of the same sandbox still running; every sandbox has its own container.
Snapshot images (repository `c2jax-snapshot`) stay in the engine for later forks;
remove them with `docker image prune --filter reference=c2jax-snapshot`.

Against a real engine (Docker or Podman's Docker-compatible API):
  export DOCKER_HOST=unix:///var/run/docker.sock   # or tcp://host:2375
  docker pull python:3.12-slim
  python -c "from c2jax import env; s = env.make_sandbox('docker', 'path/to/repo',
             image='python:3.12-slim'); print(s.run_shell('ls').text); s.close()"
`base_url=` overrides DOCKER_HOST; the tests use a fake engine on loopback
(tests/env/fake_docker_engine.py) that runs containers as bubblewrap sandboxes.
"""

import io
import os
import tarfile
import time
import uuid

import docker

from c2jax.env import limits as limits_lib
from c2jax.env import sandbox_base as sandbox_lib

_WRAPPER = 'timeout -s KILL "$0" "$@"; rc=$?; kill -9 -1 2>/dev/null; exit $rc'
_INIT = ['sleep', 'infinity']  # keeps the container alive between commands


def _tar_of_folder(folder: str) -> bytes:
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w') as tar:
    for name in sorted(os.listdir(folder)):
      tar.add(os.path.join(folder, name), arcname=name)
  return buf.getvalue()


@sandbox_lib.register_backend('docker')
class DockerSandbox(sandbox_lib.Sandbox):
  """A container over a copy of `repo`. Extra args: image, base_url (else DOCKER_HOST)."""

  def __init__(self, repo, image: str = 'python:3.12-slim', base_url: str | None = None,
               _client=None, **limits):
    self.limits = limits_lib.Limits.from_kwargs(**limits)
    self._client = _client or (docker.DockerClient(base_url=base_url) if base_url
                               else docker.from_env())
    self._container = None
    if isinstance(repo, str) and os.path.isdir(repo):
      self._container = self._start(image)
      self._container.put_archive(sandbox_lib.WORKDIR, _tar_of_folder(repo))
      self._base = self.snapshot()
    else:  # A snapshot image id from `snapshot()`.
      self._base = repo
      self._container = self._start(repo)

  def _start(self, image: str):
    memory = f'{self.limits.memory_mb}m'
    container = self._client.containers.create(
        image, command=_INIT, working_dir=sandbox_lib.WORKDIR, network_mode='none',
        environment=dict(sandbox_lib.BASE_ENVIRONMENT),
        mem_limit=memory, memswap_limit=memory, pids_limit=self.limits.max_processes,
        name=f'c2jax-{uuid.uuid4().hex[:12]}', detach=True)
    container.start()
    return container

  def _api(self):
    return self._client.api

  def exec(self, argv, timeout_s=None, stdin=b''):
    if self._container is None:
      raise sandbox_lib.SandboxError('This sandbox is closed; start a new one with '
                                     'make_sandbox.')
    if stdin:
      raise NotImplementedError('The docker backend does not pass stdin; write the '
                                'input to a file with write_file and redirect it.')
    timeout = self.limits.timeout_s if timeout_s is None else timeout_s
    start = time.monotonic()
    try:
      exec_id = self._api().exec_create(
          self._container.id, ['/bin/sh', '-c', _WRAPPER, str(max(1, round(timeout)))]
          + list(argv), workdir=sandbox_lib.WORKDIR)['Id']
    except docker.errors.APIError as e:  # the container or the daemon is gone
      raise sandbox_lib.SandboxError(f'docker could not run the command: {e}') from e
    stream = self._api().exec_start(exec_id, stream=True)
    output, truncated = bytearray(), False
    for chunk in stream:
      output += chunk
      if len(output) > self.limits.max_output_bytes:
        truncated = True
        del output[self.limits.max_output_bytes:]
        break
    stream.close()
    if truncated:  # The command may still be writing: end it and its children.
      self._api().exec_start(self._api().exec_create(
          self._container.id, ['kill', '-9', '-1'])['Id'])
    exit_code = self._api().exec_inspect(exec_id)['ExitCode']
    return sandbox_lib.ExecResult(
        exit_code=-9 if exit_code is None or truncated else exit_code,
        output=bytes(output), timed_out=exit_code == 137 and not truncated,
        truncated=truncated, duration_s=time.monotonic() - start)

  def read_file(self, path):
    rel = sandbox_lib.normalize_relpath(path)
    try:
      chunks, _ = self._container.get_archive(f'{sandbox_lib.WORKDIR}/{rel}')
    except docker.errors.NotFound:
      raise FileNotFoundError(f'No such file in the workspace: {rel}') from None
    with tarfile.open(fileobj=io.BytesIO(b''.join(chunks))) as tar:
      member = tar.next()
      if member.isdir():
        raise IsADirectoryError(f'{path!r} is a directory; use list_dir to see it.')
      if not member.isfile():
        raise sandbox_lib.PathOutsideWorkspaceError(
            f'{path!r} is a link; read the file it points to instead.')
      return tar.extractfile(member).read()

  def write_file(self, path, data):
    rel = sandbox_lib.normalize_relpath(path)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode='w') as tar:
      info = tarfile.TarInfo(rel)
      info.size = len(data)
      info.mode = 0o644
      tar.addfile(info, io.BytesIO(data))
    self._container.put_archive(sandbox_lib.WORKDIR, buf.getvalue())

  def list_files(self):
    result = self.exec(['find', '-P', '.', '-type', 'f', '-print0'])
    names = [n.removeprefix('./') for n in result.text.split('\0') if n]
    return sorted(names)

  def snapshot(self):
    image = self._container.commit(repository='c2jax-snapshot',
                                   tag=uuid.uuid4().hex[:12])
    return image.id

  def fork(self):
    return DockerSandbox(self.snapshot(), _client=self._client, **vars(self.limits))

  def reset(self):
    self._container.remove(force=True)
    self._container = self._start(self._base)

  def close(self):
    if self._container is not None:
      self._container.remove(force=True)
      self._container = None
