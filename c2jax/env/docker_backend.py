"""Docker sandbox backend, through the `docker` Python SDK: one container per sandbox.

The repository is copied into /workspace of a container made from `image` (default
DEFAULT_IMAGE, the minimal Debian image with Python and pytest that tools/setup.sh builds
locally; any image with /bin/sh, `timeout`, `kill` and the tasks' tools works). With repo
None nothing is copied: the workspace is what the image holds at /workspace (a task
image of c2jax/env/images.py, whose /workspace links to the image's WORKDIR).

Limits map to the engine's own: HostConfig Memory/MemorySwap (no swap), PidsLimit,
NanoCpus, NetworkMode 'none', the fsize ulimit, and the disk quota StorageOpt size
(Limits.disk_mb, what the sandbox may write, plus the image's size where the engine counts
the image's files too: all but btrfs with simple quotas, see btrfs.py). The engine
enforces a size only on btrfs or zfs storage, or overlay2 on xfs mounted with project
quotas (tools/setup.sh starts its dockerd on btrfs with simple quotas where the kernel
has them); other engines refuse the option, and the sandbox then runs without a quota,
with a warning, and `disk_quota_enforced` False. Past
the quota, writes fail inside with EDQUOT ("Disk quota exceeded"; ENOSPC on xfs).
Commands run as the container's root with every capability dropped and
no-new-privileges. Wall time and clean-up are enforced by wrapping each command in
`timeout -s KILL` followed by `kill -9 -1` (every process but the container's init),
output by reading at most Limits.max_output_bytes.

`snapshot` commits the container, `fork` starts a new container from that image, `reset`
replaces the container with a fresh one from the starting image and repository. The
snapshot image a fork starts from is removed when the fork closes (unless a fork of the
fork still builds on it); images of explicit `snapshot()` calls stay in the engine for
later forks: remove them with `docker image prune -a --filter reference=c2jax-snapshot`.

Environment: a command sees the image's ENV overridden by `sandbox.BASE_ENVIRONMENT`
(set on the container at creation), nothing of the launching process's: the SDK talks to
the engine over its API and passes no variables of its own. Every exec of a sandbox runs
in the one container, so a command sees the container's process 1 (a shell looping on
`sleep`, which keeps the container alive between commands, reaps orphans and has the
same environment) and any other command of the same sandbox still running; every sandbox
has its own container.

Against a real engine (Docker or Podman's Docker-compatible API):
  bash tools/setup.sh        # as root: installs and starts Docker, builds the image
  c2jax sandbox exec --backend docker --repo path/to/repo -- python -m pytest -q
`base_url=` overrides DOCKER_HOST (e.g. tcp://host:2375); `image=` or the environment
variable C2JAX_DOCKER_IMAGE override the image. The tests run against the real engine
when one is up, and always against a fake engine on loopback
(tests/env/fake_docker_engine.py) that runs containers as bubblewrap sandboxes.
"""

import io
import os
import tarfile
import time
import uuid

from absl import logging
import docker

from c2jax.env import btrfs
from c2jax.env import limits as limits_lib
from c2jax.env import sandbox_base as sandbox_lib

DEFAULT_IMAGE = 'c2jax-sandbox:bookworm'
# stderr joins stdout in one pipe, so the output keeps the order the command wrote it in
# (docker's two streams do not: cargo's `Running <test binary>` headers, on stderr, came
# after the results they head, on stdout, and test ids went to the wrong binary).
_WRAPPER = 'timeout -s KILL "$0" "$@" 2>&1; rc=$?; kill -9 -1 2>/dev/null; exit $rc'
# Process 1 keeps the container alive between commands, survives their `kill -9 -1`
# (the kernel spares a namespace's init) and reaps the orphans they leave: `sleep
# infinity` alone would let zombies pile up until they fill the pids limit.
_INIT = ['/bin/sh', '-c', 'while :; do sleep 3600 & wait; done']
_ENGINES_WITHOUT_QUOTA: set[str] = set()  # base URLs of engines that refused a size
_ENGINE_CPUS: dict[str, float] = {}  # base URL -> the engine host's CPU count
_QUOTA_COUNTS_IMAGE: dict[str, bool] = {}  # base URL -> whether a size counts image files
_LOCAL_ENGINE = 'http+docker://localhost'  # the SDK's base URL for a unix socket


def sandbox_image() -> str:
  """The image sandboxes start from unless told otherwise."""
  return os.environ.get('C2JAX_DOCKER_IMAGE') or DEFAULT_IMAGE


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
  # Commands run as a root without CAP_DAC_OVERRIDE: they may change only files they own.
  info.uid = info.gid = 0
  info.uname = info.gname = 'root'
  return info


def _tar_of_folder(folder: str) -> bytes:
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w') as tar:
    for name in sorted(os.listdir(folder)):
      tar.add(os.path.join(folder, name), arcname=name, filter=_root_owned)
  return buf.getvalue()


def _refuses_storage_size(error: docker.errors.APIError) -> bool:
  text = str(error).lower()
  return 'storage' in text and ('opt' in text or 'quota' in text or 'size' in text)


@sandbox_lib.register_backend('docker')
class DockerSandbox(sandbox_lib.Sandbox):
  """A container over a copy of `repo` (None: over the image's own /workspace). Extra
  args: image (else C2JAX_DOCKER_IMAGE, else DEFAULT_IMAGE), base_url (else DOCKER_HOST)."""

  def __init__(self, repo, image: str | None = None, base_url: str | None = None,
               _client=None, **limits):
    self.limits = limits_lib.Limits.from_kwargs(**limits)
    self._client = _client or (docker.DockerClient(base_url=base_url) if base_url
                               else docker.from_env())
    self._container = None
    self._owned_image = None  # a fork's snapshot image, removed when it closes
    if repo is None:  # the image's own workspace
      self._base = (image or sandbox_image(), None)
    elif isinstance(repo, str) and os.path.isdir(repo):
      # Reset starts again from the image and the repository: no commit is needed unless
      # the sandbox is forked.
      self._base = (image or sandbox_image(), os.path.abspath(repo))
    else:  # A snapshot image id from `snapshot()`.
      self._base = (repo, None)
    self._container = self._start(*self._base)

  def _start(self, image: str, repo: str | None):
    try:
      size = self._client.images.get(image).attrs.get('Size') or 0
    except docker.errors.ImageNotFound:
      raise RuntimeError(
          f'The docker engine has no image {image!r}: build the sandbox image with '
          '`bash tools/setup.sh` (as root), or pass image= (or set C2JAX_DOCKER_IMAGE) '
          'to one that provides /bin/sh, timeout, kill and python. A task image '
          '(c2jax-task:...) removed since its task was loaded is rebuilt by loading the '
          'task folder again with build_images (c2jax eval: remove the run\'s '
          'tasks/tasks.jsonl).') from None
    except docker.errors.APIError as e:
      raise sandbox_lib.SandboxError(f'docker could not inspect image {image!r}: {e}') from e
    memory = f'{self.limits.memory_mb}m'
    options = dict(
        command=_INIT, working_dir=sandbox_lib.WORKDIR, network_mode='none',
        environment=dict(sandbox_lib.BASE_ENVIRONMENT), mem_limit=memory,
        memswap_limit=memory, pids_limit=self.limits.max_processes,
        nano_cpus=round(min(self.limits.cpus, self._engine_cpus()) * 1e9), cap_drop=['ALL'],
        security_opt=['no-new-privileges'], detach=True,
        ulimits=[docker.types.Ulimit(name='fsize', soft=self.limits.max_file_mb << 20,
                                     hard=self.limits.max_file_mb << 20)])
    counted = (size >> 20) if self._quota_counts_image() else 0
    quota = {'size': f'{counted + self.limits.disk_mb}m'}
    url = self._client.api.base_url
    self.disk_quota_enforced = url not in _ENGINES_WITHOUT_QUOTA
    try:
      container = self._create(image, options, quota if self.disk_quota_enforced else None)
    except docker.errors.APIError as e:
      if not (self.disk_quota_enforced and _refuses_storage_size(e)):
        raise sandbox_lib.SandboxError(f'docker could not create a container: {e}') from e
      self.disk_quota_enforced = False
      if url not in _ENGINES_WITHOUT_QUOTA:
        _ENGINES_WITHOUT_QUOTA.add(url)
        logging.warning(
            'The docker engine at %s cannot enforce a disk quota (%s); sandboxes there run '
            'without one (disk_mb=%d is not applied). Run the engine on btrfs or zfs '
            'storage, or overlay2 on xfs with pquota (tools/setup.sh does btrfs).',
            url, e, self.limits.disk_mb)
      container = self._create(image, options, None)
    if repo is not None:
      try:
        container.put_archive(sandbox_lib.WORKDIR, _tar_of_folder(repo))
      except (docker.errors.APIError, OSError) as e:
        container.remove(force=True)
        raise sandbox_lib.SandboxError(f'docker could not copy {repo} in: {e}') from e
    return container

  def _engine_cpus(self) -> float:
    """The engine host's CPU count: the engine refuses a larger quota."""
    url = self._client.api.base_url
    if url not in _ENGINE_CPUS:
      _ENGINE_CPUS[url] = float(self._client.info().get('NCPU') or 1)
    return _ENGINE_CPUS[url]

  def _quota_counts_image(self) -> bool:
    """Whether the engine's size counts the files a container shares with its image. Only
    an engine on this host, on btrfs with simple quotas, is known to count just what a
    container writes; any other (another host's, or a root folder this process may not
    open) gets the image's size added, a quota looser by that much rather than one its
    image alone would fill."""
    url = self._client.api.base_url
    if url not in _QUOTA_COUNTS_IMAGE:
      mode = None
      info = self._client.info() if url == _LOCAL_ENGINE else {}
      if info.get('Driver') == 'btrfs':
        try:
          mode = btrfs.quota_mode(os.path.join(info.get('DockerRootDir', ''), 'btrfs'))
        except OSError as e:
          logging.info('Cannot read the quota mode of the docker engine\'s btrfs (%s): '
                       'sandbox sizes count the image\'s files.', e)
      _QUOTA_COUNTS_IMAGE[url] = mode != 'simple'
    return _QUOTA_COUNTS_IMAGE[url]

  def _create(self, image, options, storage_opt):
    container = self._client.containers.create(
        image, name=f'c2jax-{uuid.uuid4().hex[:12]}',
        **options, **({'storage_opt': storage_opt} if storage_opt else {}))
    try:
      container.start()
    except docker.errors.APIError:
      container.remove(force=True)
      raise
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
    child = DockerSandbox(self.snapshot(), _client=self._client, **vars(self.limits))
    child._owned_image = child._base[0]  # pylint: disable=protected-access
    return child

  def reset(self):
    self._container.remove(force=True)
    self._container = None
    self._container = self._start(*self._base)

  def close(self):
    if self._container is not None:
      self._container.remove(force=True)
      self._container = None
    image, self._owned_image = self._owned_image, None
    if image is not None:
      try:  # A fork's snapshot is its own; one a later fork still builds on stays.
        self._client.images.remove(image)
      except docker.errors.APIError:
        pass
