"""Environment images: what a task's docker sandboxes start from when its tests need
more than the sandbox image (Debian bookworm's python3 and pytest) holds.

    tag = env_images.image_for(task)   # '' when the sandbox image serves as it is

The docker backend copies the task's repository into /workspace of a container made
from this image, as it does over the sandbox image, and every episode forks from there.
The image is the sandbox image plus, in one layer:
- go: the files of the host's Debian packages that provide `go` (golang-go and the
  versioned compiler and standard library it points to);
- node: the host's `nodejs` package (node, npm and npx) with the libraries it needs;
- rust: rustc's sysroot (cargo, rustc, the standard library; not its documentation) and
  the C toolchain cargo links with (the host's gcc and binutils packages);
- python (a task with a verified venv layer, `c2jax tasks install`): the layer and the
  interpreter it was made with, at their host paths, the layer's bin/ first on PATH
  (the image's python3 would be another version, and test ids such as parametrised
  ones can differ between versions);
- every language: `patch`, which grading applies test patches with.
Host packages come with what they depend on that the sandbox image lacks (dpkg's own
records, `apt-cache depends --installed`), so the sandboxes run the very toolchain the
task builder and the bubblewrap sandboxes run (the same test ids, the same Cargo.lock
format), on the same Debian release.

Built once: the tag, `c2jax-env:<language>-<hash>`, hashes the sandbox image's id and
every file's path, size, mode, modification time and link target, so a second task of
the language (any repository of it) finds the image; an upgraded toolchain gets a new
one. Processes of one host that need the same image at once build it once: the others
wait for it on a lock file in the temporary folder. To build them ahead of a run:

    python -m c2jax.env.env_images [go] [node] [rust]   # default: each one installed here

A failed build raises EnvImageError, which the episode reports as an
infrastructure error, never as the policy's failure. Remove the images with
`docker images c2jax-env -q | xargs -r docker rmi`.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

from absl import logging

REPOSITORY = 'c2jax-env'
_RECIPE = 'c2jax-env-image-1'  # bump when the layout changes: every image is rebuilt
_LOCK = threading.Lock()
_BUILT: dict[tuple[str, str], str] = {}  # (language, layer) -> tag, this process


class EnvImageError(RuntimeError):
  """An environment image could not be made; the message says why and what to do."""


def _run(argv: list[str]) -> str:
  proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
  if proc.returncode != 0:
    raise EnvImageError(f'`{" ".join(argv)}` failed ({proc.returncode}): '
                        f'{proc.stderr.strip()[-500:]}')
  return proc.stdout


def _owner(path: str) -> str:
  """The Debian package that installed `path` on the host."""
  found = shutil.which(path) if not os.path.isabs(path) else path
  if found is None:
    raise EnvImageError(f'{path} is not installed on this host; the environment image '
                        'copies the host\'s toolchain.')
  for candidate in (found, os.path.realpath(found)):
    proc = subprocess.run(['dpkg', '-S', candidate], capture_output=True, text=True,
                          check=False)
    if proc.returncode == 0:
      return proc.stdout.split(':', 1)[0].strip()
  raise EnvImageError(f'{found} was not installed by a Debian package, so c2jax cannot '
                      'tell which files it needs; install it with apt-get.')


def _closure(packages: list[str], present: set[str]) -> list[str]:
  """`packages` and the installed packages they depend on, recursively, without those
  in `present` (the sandbox image's)."""
  out = _run(['apt-cache', 'depends', '--recurse', '--installed', '--no-recommends',
              '--no-suggests', '--no-conflicts', '--no-breaks', '--no-replaces',
              '--no-enhances', *packages])
  names = {line.strip().split(':')[0] for line in out.splitlines()
           if line and not line[0].isspace() and not line.startswith('<')}
  installed = set(_run(['dpkg-query', '-W', '-f', '${Package}\\n']).split())
  return sorted((names & installed) - present)


def _package_files(packages: list[str]) -> list[str]:
  if not packages:
    return []
  files = []
  for line in _run(['dpkg', '-L', *packages]).splitlines():
    path = line.strip()
    if path and (os.path.islink(path) or os.path.isfile(path)):
      files.append(path)
  return files


def _tree_files(root: str, skip: tuple[str, ...] = ()) -> list[str]:
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skip]
    files += [os.path.join(dirpath, f) for f in filenames]
    files += [os.path.join(dirpath, d) for d in dirnames
              if os.path.islink(os.path.join(dirpath, d))]
  return files


def _is_elf(path: str) -> bool:
  if os.path.islink(path) or not os.path.isfile(path):
    return False
  with open(path, 'rb') as f:
    return f.read(4) == b'\x7fELF'


def _library_packages(files: list[str], present: set[str]) -> list[str]:
  """The host packages holding the shared libraries that the ELF files among `files`
  load (ldd), with what they depend on, less the sandbox image's: a Python built by
  pyenv loads Tk for tkinter, rustc loads zlib."""
  elves = [f for f in files if _is_elf(f)]
  libraries = set()
  for start in range(0, len(elves), 64):
    proc = subprocess.run(['ldd', *elves[start:start + 64]], capture_output=True, text=True,
                          check=False)
    libraries.update(re.findall(r'=> (/\S+) \(0x', proc.stdout))
  if not libraries:
    return []
  owners = set()
  for path in sorted(libraries):
    for candidate in (path, os.path.realpath(path)):
      proc = subprocess.run(['dpkg', '-S', candidate], capture_output=True, text=True,
                            check=False)
      if proc.returncode == 0:
        owners.add(proc.stdout.split(':', 1)[0].strip())
        break
  return _closure(sorted(owners), present) if owners else []


def _sysroot() -> str:
  return _run(['rustc', '--print', 'sysroot']).strip()


def _toolchain(language: str, present: set[str]
               ) -> tuple[list[str], dict[str, str], list[str]]:
  """(host files, environment variables, Dockerfile RUN lines) of a language's
  toolchain."""
  if language == 'go':
    go = shutil.which('go') or 'go'
    return _package_files(_closure([_owner(go), _owner(os.path.realpath(go))],
                                   present)), {}, []
  if language == 'node':
    # npm (and npx) as they are on disk: `npm install -g npm` replaces the files dpkg
    # lists with others.
    npm_cli = os.path.realpath(shutil.which('npm') or 'npm')
    npm_root = os.path.dirname(os.path.dirname(npm_cli))
    return (_package_files(_closure([_owner('node')], present)) + _tree_files(npm_root),
            {}, [])
  if language == 'rust':
    sysroot = _sysroot()
    files = _tree_files(sysroot, skip=(os.path.join(sysroot, 'share'),))
    # cargo links with `cc`, which on the host is a link Debian's alternatives make.
    files += _package_files(_closure([_owner('gcc'), 'libc6-dev'], present))
    return files, {'PATH': f'{sysroot}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:'
                           '/usr/bin:/sbin:/bin'}, ['RUN ln -sf gcc /usr/bin/cc']
  if language == 'python':
    return [], {}, []  # the layer's files come from _python_layer
  raise EnvImageError(f'No environment image is known for language {language!r}; one of '
                      "'go', 'node', 'rust', 'python'.")


def _python_layer(layer: str) -> tuple[list[str], dict[str, str]]:
  """(host files, environment) that run a venv layer as on the host: the layer and the
  interpreter it was made with (pyvenv.cfg's home; the image's own when that is
  Debian's, under /usr), at their host paths, the layer's bin/ first on PATH."""
  try:
    with open(os.path.join(layer, 'pyvenv.cfg'), encoding='utf-8') as f:
      config = dict(line.split(' = ', 1) for line in f.read().splitlines() if ' = ' in line)
  except FileNotFoundError as e:
    raise EnvImageError(f'{layer} is not a venv layer (no pyvenv.cfg); make it with '
                        '`c2jax tasks install`.') from e
  prefix = os.path.dirname(config.get('home', '/usr/bin').rstrip('/'))
  files = _tree_files(layer)
  if not prefix.startswith('/usr'):
    # The standard library's own tests are 100+ MB that nothing imports.
    files += _tree_files(prefix, skip=tuple(glob.glob(os.path.join(prefix, 'lib',
                                                                   'python3*', 'test'))))
  return files, {'PATH': f'{layer}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:'
                         '/usr/bin:/sbin:/bin', 'VIRTUAL_ENV': layer}


def _digest(files: list[str], extra: str) -> str:
  h = hashlib.sha256((_RECIPE + extra).encode())
  for path in sorted(set(files)):
    info = os.lstat(path)
    link = os.readlink(path) if os.path.islink(path) else ''
    h.update(f'{path}\0{info.st_size}\0{info.st_mode}\0{int(info.st_mtime)}\0{link}\n'
             .encode())
  return h.hexdigest()[:16]


def _context(files: list[str], env: dict[str, str], runs: list[str], base: str,
             out) -> None:
  """A build context: the files under root/ at their host paths (resolved through the
  host's /lib -> /usr/lib links, as the image has them), the Dockerfile copying them in."""
  lines = [f'FROM {base}', 'COPY root/ /', *runs]
  lines += [f'ENV {key}={json.dumps(value)}' for key, value in sorted(env.items())]
  with tarfile.open(fileobj=out, mode='w') as tar:
    for path in sorted(set(files)):
      if '__pycache__' in path:
        continue
      real_dir = os.path.realpath(os.path.dirname(path))
      tar.add(path, arcname='root' + os.path.join(real_dir, os.path.basename(path)),
              recursive=False)
    dockerfile = ('\n'.join(lines) + '\n').encode()
    info = tarfile.TarInfo('Dockerfile')
    info.size = len(dockerfile)
    tar.addfile(info, io.BytesIO(dockerfile))


def _has_image(client, tag: str) -> bool:
  import docker  # pylint: disable=g-import-not-at-top

  try:
    client.images.get(tag)
    return True
  except docker.errors.ImageNotFound:
    return False


@contextlib.contextmanager
def _host_lock(tag: str):
  """Held while this process builds `tag`: another process of this host that needs the
  same image waits here, then finds it built."""
  path = os.path.join(tempfile.gettempdir(), 'c2jax-' + re.sub(r'[^\w.-]', '-', tag) + '.lock')
  with open(path, 'a') as f:
    fcntl.flock(f, fcntl.LOCK_EX)  # let go of when the file closes, raising or not
    yield


def _build_image(client, language, tag, files, env, runs, base) -> None:
  import docker  # pylint: disable=g-import-not-at-top

  logging.info('Building the %s environment image %s (%d host files)', language, tag,
               len(files))
  with tempfile.TemporaryFile() as context:
    _context(files, env, runs, base, context)
    context.seek(0)
    try:
      client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True,
                          forcerm=True, network_mode='none')
    except docker.errors.BuildError as e:
      log = ''.join(str(part.get('stream', part)) for part in e.build_log)
      raise EnvImageError(f'Building the {language} environment image {tag} '
                          f'failed: {e}\n{log[-2000:]}') from e


def build(language: str, layer: str = '', client=None) -> str:
  """The tag of the environment image of `language` (with the venv `layer` and its
  interpreter for a Python task), building it when the engine does not have it."""
  import docker  # pylint: disable=g-import-not-at-top  # the SDK takes ~0.3 s to import

  from c2jax.env import docker_backend  # pylint: disable=g-import-not-at-top

  key = (language, layer)
  with _LOCK:
    if key in _BUILT:
      return _BUILT[key]
    own = client is None
    client = client or docker.from_env()
    try:
      base = docker_backend.sandbox_image()
      try:
        base_image = client.images.get(base)
      except docker.errors.ImageNotFound as e:
        raise EnvImageError(f'The docker engine has no image {base}: build it with '
                            '`bash tools/setup.sh` (as root).') from e
      present = set(client.containers.run(
          base, ['dpkg-query', '-W', '-f', '${Package}\\n'], remove=True,
          network_disabled=True).decode().split())
      files, env, runs = _toolchain(language, present)
      files += _package_files(_closure(['patch'], present))
      if layer:
        layer_files, env = _python_layer(layer)
        files += layer_files
      # What the copied trees (rustup's sysroot, pyenv's Python) load from the host.
      files += _package_files(_library_packages(
          [f for f in files if not f.startswith('/usr/')], present))
      tag = f'{REPOSITORY}:{language}-{_digest(files, base_image.id + str(env) + str(runs))}'
      if not _has_image(client, tag):
        with _host_lock(tag):
          if not _has_image(client, tag):  # else another process here built it meanwhile
            _build_image(client, language, tag, files, env, runs, base)
    except docker.errors.DockerException as e:
      raise EnvImageError(f'The docker engine could not make the {language} environment '
                          f'image ({e}); is it running (`bash tools/setup.sh`)?') from e
    finally:
      if own:
        client.close()
    _BUILT[key] = tag
    return tag


def image_for(task) -> str:
  """The environment image a task's docker sandboxes start from: its language's, or for
  a Python task with a venv layer the layer's; '' when the sandbox image serves (a
  Python task without a layer, a hand-made task)."""
  language = getattr(task, 'language', '') or ''
  layer = getattr(task, 'environment', '') or ''
  if language in ('go', 'node', 'rust'):
    return build(language)
  if layer:
    return build('python', layer)
  return ''


# What each language's image copies from the host: without it there is nothing to build.
_TOOL = {'go': 'go', 'node': 'node', 'rust': 'rustc'}


def main(argv: list[str]) -> int:
  """Builds the environment images of the languages named (default: each whose toolchain
  is installed here), printing each one's tag and seconds; a language without its
  toolchain is said and skipped."""
  wanted = argv or sorted(_TOOL)
  unknown = [name for name in wanted if name not in _TOOL]
  if unknown:
    print(f'env_images: unknown language(s) {unknown}; give any of {sorted(_TOOL)} (a '
          "Python task's image is made from its venv layer, by `c2jax tasks install`).",
          file=sys.stderr)
    return 2
  failed = False
  for language in wanted:
    if shutil.which(_TOOL[language]) is None:
      print(f'{language}: skipped, {_TOOL[language]} is not installed on this host', flush=True)
      continue
    started = time.monotonic()
    try:
      tag = build(language)
    except EnvImageError as e:
      print(f'{language}: {e}', file=sys.stderr, flush=True)
      failed = True
      continue
    print(f'{language}: {tag} ({time.monotonic() - started:.0f} s)', flush=True)
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
