"""Task images: a Terminal-Bench / Harbor folder's Dockerfile, built by the docker engine.

    built = images.build_task_image('tasks/hello/environment', name='hello')
    built.tag      # 'c2jax-task:hello-3f2a9c0d1e4b5a6c': the task's sandboxes start from it
    built.workdir  # '/app': the image's WORKDIR, which is the sandbox's workspace

Base images. No image registry is assumed reachable, so each FROM is resolved locally, in
this order: an entry of `base_images` (a FROM reference or glob -> a local image; the
`terminal_bench` suite's `base_images` argument, 'FROM=IMAGE' strings); the image itself,
when the engine has it (used as is); the built-in table below, whose bases map to the
sandbox image that tools/setup.sh builds (C2JAX_DOCKER_IMAGE, else
c2jax-sandbox:bookworm: Debian bookworm's python3 3.11 with pytest, apt-get, useradd
and pip, which installs into the system Python as in the python:3 images);
else BaseImageError names the base, the table and what to do. A FROM naming an earlier
stage, `scratch`, or a global ARG with a default is understood; the rewritten FROM
lines are the only change to the task's own instructions.

  python:3[.x[.y]][-slim][-bookworm] (and latest, slim, bookworm, slim-bookworm)
  debian:bookworm[-slim], debian:12[-slim]
  ubuntu:22.04, ubuntu:24.04, ubuntu:jammy, ubuntu:noble
  ghcr.io/laude-institute/t-bench/python-3-13:* and t-bench/ubuntu-24-04:*

Caching. The tag is `c2jax-task:<folder name>-<hash>`, the hash over the build context
(paths, executable bits and contents of the files .dockerignore keeps), the rewritten
Dockerfile and the ids of the local base images: a second load of an unchanged folder
finds the tag and builds nothing (`TaskImage.built` False); an edited folder or a rebuilt
base gives a new tag. Images stay in the engine; remove them with
`docker images c2jax-task -q | xargs -r docker rmi`. The untagged images the engine's
builder leaves for a multi-stage build's earlier stages are removed after the build (so a
rebuild after an edit runs those stages again).

The workspace. Terminal-Bench and Harbor Dockerfiles set a WORKDIR (usually /app), COPY
the task's files into it, and their tests run there. c2jax's sandboxes work in
/workspace (sandbox_base.WORKDIR): so a last step, appended to the Dockerfile, makes
/workspace a symbolic link to the image's WORKDIR. The sandbox's workspace is then the
WORKDIR itself, with the files the Dockerfile put there and nothing else (the build
context is not copied in); commands start there (`pwd -P` says /app), absolute /app/...
paths in tasks and tests work, and the file tools take paths relative to it (or under
/workspace). An image whose WORKDIR is / (or unset) gets an empty /workspace; a WORKDIR
inside /workspace, or a /workspace already holding files, is a build error. The same
step clears any ENTRYPOINT (sandboxes run their own process 1) and runs as root,
restoring the Dockerfile's last USER after it.

Network. The build runs on the engine's default build network, so RUN steps may reach
the package registries the host reaches (apt, pip, npm mirrors); the sandboxes that
start from the image have no network, as always.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import io
import os
import re
import stat
import tarfile
import tempfile
from collections.abc import Mapping, Sequence

from absl import logging
import docker

from c2jax.env import docker_backend
from c2jax.env import sandbox_base

REPOSITORY = 'c2jax-task'
# Bump when the appended step changes: every task image is then rebuilt.
_RECIPE = 'c2jax-task-image-1'
_DOCKERFILE_NAME = '.c2jax.Dockerfile'  # the rewritten Dockerfile, inside the sent context
_LOG_TAIL_CHARS = 3000

# (as shown to users, a regular expression over a normalised reference 'name:tag').
BUILTIN_BASES = (
    ('python:3[.x[.y]][-slim][-bookworm] (and latest, slim, bookworm, slim-bookworm)',
     r'python:(3(\.\d+){0,2}(-slim)?(-bookworm)?|latest|slim|bookworm|slim-bookworm)'),
    ('debian:bookworm[-slim], debian:12[-slim]', r'debian:(bookworm|12)(-slim)?'),
    ('ubuntu:22.04, ubuntu:24.04, ubuntu:jammy, ubuntu:noble',
     r'ubuntu:(22\.04|24\.04|jammy|noble)'),
    ('ghcr.io/laude-institute/t-bench/python-3-13:*',
     r'ghcr\.io/laude-institute/t-bench/python-3-13:.+'),
    ('ghcr.io/laude-institute/t-bench/ubuntu-24-04:*',
     r'ghcr\.io/laude-institute/t-bench/ubuntu-24-04:.+'),
)

# Makes /workspace the image's WORKDIR (the RUN's working directory); see the docstring.
_LINK_WORKSPACE = (
    'd="$(pwd)"; case "$d" in '
    f'{sandbox_base.WORKDIR}) ;; '
    f'/) mkdir -p {sandbox_base.WORKDIR} ;; '
    f'{sandbox_base.WORKDIR}/*) echo "c2jax: WORKDIR $d lies inside {sandbox_base.WORKDIR}, '
    'the sandbox workspace; use a folder outside it (e.g. /app)" >&2; exit 1 ;; '
    f'*) if [ -e {sandbox_base.WORKDIR} ] && ! rmdir {sandbox_base.WORKDIR} 2>/dev/null; '
    f'then echo "c2jax: the image has files in {sandbox_base.WORKDIR} but its WORKDIR is '
    f'$d; c2jax makes {sandbox_base.WORKDIR} a link to the WORKDIR, so keep '
    f'{sandbox_base.WORKDIR} empty" >&2; exit 1; fi; '
    f'ln -s "$d" {sandbox_base.WORKDIR} ;; esac')


class ImageBuildError(RuntimeError):
  """A task's Dockerfile could not be built: the message names the step and ends with the
  end of the engine's build log."""


class BaseImageError(ImageBuildError):
  """A FROM names an image that is neither local, nor mapped, nor in the base table."""


@dataclasses.dataclass(frozen=True)
class TaskImage:
  tag: str  # c2jax-task:<name>-<hash>
  workdir: str  # the image's WORKDIR: the sandbox workspace (/workspace links to it)
  bases: dict[str, str]  # each FROM's image (ARGs filled in) -> the local image used
  built: bool  # False when the tag was already in the engine (nothing was built)


def parse_base_images(entries: Sequence[str]) -> dict[str, str]:
  """{FROM reference or glob: local image} from 'FROM=IMAGE' strings (suite.args)."""
  table = {}
  for entry in entries:
    base, sep, image = (entry if isinstance(entry, str) else '').partition('=')
    if not sep or not base.strip() or not image.strip():
      raise ValueError(f'base image entry {entry!r} is not FROM=IMAGE; write e.g. '
                       "'node:20-slim=my-node:20' (a FROM reference or glob, then the "
                       'local image to build on).')
    table[base.strip()] = image.strip()
  return table


def settings_problem(build_images: bool, base_images: Sequence[str],
                     backend: str) -> tuple[str, str] | None:
  """(the setting, what is wrong with it and what to do) where a run's task-image settings
  cannot work (a malformed base_images entry, build_images off docker), else None."""
  try:
    parse_base_images(base_images)
  except ValueError as e:
    return 'base_images', str(e)
  if build_images and backend != 'docker':
    return 'build_images', (
        f"is True but agent.backend is {backend!r}, which cannot start a sandbox from an "
        "image; set --config.agent.backend=docker, or build_images=False (each task then "
        "runs in a copy of its environment/ folder with the sandbox's own tools, not in its "
        "Dockerfile's image).")
  return None


def normalize_reference(ref: str) -> str:
  """'name:tag' without a digest or Docker Hub's implied prefixes: docker.io/library/
  python:3.11-slim@sha256:... -> python:3.11-slim; a missing tag is 'latest'."""
  ref = ref.split('@', 1)[0]
  for prefix in ('docker.io/', 'index.docker.io/', 'registry-1.docker.io/'):
    ref = ref.removeprefix(prefix)
  ref = ref.removeprefix('library/')
  if ':' not in ref.rsplit('/', 1)[-1]:
    ref += ':latest'
  return ref


def _table_text(base_images: Mapping[str, str]) -> str:
  lines = [f'  {shown} -> {docker_backend.sandbox_image()}' for shown, _ in BUILTIN_BASES]
  lines += [f'  {base} -> {image} (base_images)' for base, image in base_images.items()]
  return '\n'.join(lines)


def _local_id(client, image: str) -> str | None:
  try:
    return client.images.get(image).id
  except docker.errors.ImageNotFound:
    return None
  except docker.errors.APIError as e:  # e.g. a reference the engine cannot parse
    raise BaseImageError(f'The docker engine could not look up image {image!r}: {e}') from e


def resolve_base(client, ref: str, base_images: Mapping[str, str], where: str) -> str:
  """The local image a FROM reference builds on (see the module docstring's order)."""
  norm = normalize_reference(ref)
  for base, image in base_images.items():
    if fnmatch.fnmatchcase(norm, normalize_reference(base)) or fnmatch.fnmatchcase(ref, base):
      if _local_id(client, image) is None:
        raise BaseImageError(
            f'{where}: FROM {ref} maps to {image} (base_images entry {base!r}), which the '
            f'docker engine does not have; build or load {image}, or change the entry.')
      return image
  if _local_id(client, ref) is not None:
    return ref
  for _, pattern in BUILTIN_BASES:
    if re.fullmatch(pattern, norm):
      image = docker_backend.sandbox_image()
      if _local_id(client, image) is None:
        raise BaseImageError(
            f'{where}: FROM {ref} maps to the sandbox image {image}, which the docker '
            'engine does not have: build it with `bash tools/setup.sh` (as root), or set '
            'C2JAX_DOCKER_IMAGE to a local image with /bin/sh, python3 and pytest.')
      return image
  raise BaseImageError(
      f'{where}: FROM {ref} names an image the docker engine does not have, and the base '
      f'image table does not map it:\n{_table_text(base_images)}\nMake {ref} local (`docker '
      'pull` where a registry is reachable, `docker load`, or build it), or map it to a '
      "local image: the terminal_bench suite's --config.suite.args.base_images="
      f"\"('{norm}=LOCAL_IMAGE',)\" (images.build_task_image(base_images=...)).")


@dataclasses.dataclass(frozen=True)
class _Instruction:
  start: int  # its first line (0-based)
  end: int  # one past its last line
  keyword: str  # upper case
  args: str  # its arguments, continuation lines joined


def _instructions(lines: list[str]) -> list[_Instruction]:
  """The Dockerfile's instructions with their line spans (continuations joined; comment
  and empty lines inside a continuation skipped, as the engine does)."""
  escape = '\\'
  for line in lines:  # parser directives: comment lines before anything else
    directive = re.fullmatch(r'#\s*(\w+)\s*=\s*(\S+)\s*', line.strip())
    if not directive:
      break
    if directive.group(1).lower() == 'escape':
      escape = directive.group(2)
  out, i = [], 0
  while i < len(lines):
    if not lines[i].strip() or lines[i].lstrip().startswith('#'):
      i += 1
      continue
    start, parts = i, []
    while i < len(lines):
      text = lines[i].rstrip()
      i += 1
      if not text.endswith(escape):
        parts.append(text)
        break
      parts.append(text[:-1])
      while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith('#')):
        i += 1
    keyword, _, args = ' '.join(p.strip() for p in parts).partition(' ')
    out.append(_Instruction(start, i, keyword.upper(), args.strip()))
  return out


def _global_args(instructions: list[_Instruction]) -> dict[str, str]:
  """Defaults of the ARGs before the first FROM: the only variables a FROM may use."""
  defaults = {}
  for ins in instructions:
    if ins.keyword == 'FROM':
      break
    if ins.keyword == 'ARG':
      for word in ins.args.split():
        name, _, value = word.partition('=')
        defaults[name] = value.strip('"\'')
  return defaults


def _substitute(ref: str, defaults: dict[str, str], where: str) -> str:
  def value(match):
    name, fallback = match.group(1) or match.group(3), match.group(2)
    if defaults.get(name):
      return defaults[name]
    if fallback is not None:
      return fallback
    raise ImageBuildError(f'{where}: FROM {ref} uses ${name}, which no ARG before the first '
                          'FROM gives a default; c2jax builds without --build-arg, so give '
                          f'it one (ARG {name}=...).')
  return re.sub(r'\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)', value, ref)


def _rewrite(text: str, client, base_images, where):
  """(the Dockerfile with its FROM lines resolved and c2jax's last step appended, {FROM's
  image: local image}, the local bases' ids, the number of appended steps)."""
  lines = text.splitlines()
  instructions = _instructions(lines)
  froms = [ins for ins in instructions if ins.keyword == 'FROM']
  if not froms:
    raise ImageBuildError(f'{where} has no FROM instruction; a Dockerfile starts from a '
                          'base image.')
  defaults, stages, bases, ids = _global_args(instructions), set(), {}, []
  replaced = {}
  for ins in froms:
    words = ins.args.split()
    flags = [w for w in words if w.startswith('--')]
    rest = [w for w in words if not w.startswith('--')]
    if not rest:
      raise ImageBuildError(f'{where}: `FROM {ins.args}` names no image.')
    ref = _substitute(rest[0], defaults, where)
    alias = rest[2].lower() if len(rest) >= 3 and rest[1].lower() == 'as' else None
    if ref.lower() not in stages and ref != 'scratch':
      image = bases.get(ref) or resolve_base(client, ref, base_images, where)
      bases[ref] = image
      ids.append(_local_id(client, image))
      note = f'# c2jax: FROM {ref} builds on the local image {image}'
      replaced[ins.start] = (ins.end, [note, ' '.join(['FROM', *flags, image, *rest[1:]])])
    if alias:
      stages.add(alias)
  out, i = [], 0
  while i < len(lines):
    if i in replaced:
      end, new = replaced[i]
      out += new
      i = end
    else:
      out.append(lines[i])
      i += 1
  last_stage = [ins for ins in instructions if ins.start >= froms[-1].start]
  user = next((ins.args for ins in reversed(last_stage) if ins.keyword == 'USER'), None)
  # Each step costs the engine a container: clear the entrypoint only where there is one.
  entrypoint = any(ins.keyword == 'ENTRYPOINT' for ins in instructions) or any(
      (client.images.get(image).attrs.get('Config') or {}).get('Entrypoint')
      for image in set(bases.values()))
  tail = (['USER root'] if user else []) + [f'RUN {_LINK_WORKSPACE}']
  tail += (['ENTRYPOINT []'] if entrypoint else []) + ([f'USER {user}'] if user else [])
  out += ['', f'# c2jax (c2jax/env/images.py): {sandbox_base.WORKDIR} is the WORKDIR.', *tail]
  return '\n'.join(out) + '\n', bases, ids, len(tail)


def _context_files(context: str, dockerfile: str) -> list[str]:
  """Relative paths (files, folders, links) of the context that .dockerignore keeps."""
  patterns = []
  ignore = os.path.join(context, '.dockerignore')
  if os.path.isfile(ignore):
    with open(ignore) as f:
      patterns = [line.strip() for line in f if line.strip() and not line.startswith('#')]
  kept = docker.utils.build.exclude_paths(context, patterns, dockerfile=dockerfile)
  return sorted(p for p in kept if p != _DOCKERFILE_NAME)


def _context_hash(context: str, files: list[str], dockerfile_text: str,
                  ids: list[str]) -> str:
  """The hash naming the image (files are read in blocks: contexts may hold data sets)."""
  digest = hashlib.sha256(f'{_RECIPE}\0{dockerfile_text}\0{ids}\0'.encode())
  for rel in files:
    full = os.path.join(context, rel)
    mode = os.lstat(full).st_mode
    link = os.readlink(full) if stat.S_ISLNK(mode) else ''
    digest.update(f'{rel}\0{stat.S_IFMT(mode)}\0{mode & 0o111}\0{link}\0'.encode())
    if stat.S_ISREG(mode):
      with open(full, 'rb') as f:
        while block := f.read(1 << 20):
          digest.update(block)
  return digest.hexdigest()[:16]


def _context_tar(context: str, files: list[str], dockerfile_text: str, out) -> None:
  """Writes the tar the engine builds from: the kept files and the rewritten Dockerfile."""
  with tarfile.open(fileobj=out, mode='w') as tar:
    for rel in files:
      info = tar.gettarinfo(os.path.join(context, rel), arcname=rel)
      info.uid = info.gid = 0
      info.uname = info.gname = 'root'
      if info.isfile():
        with open(os.path.join(context, rel), 'rb') as f:
          tar.addfile(info, f)
      else:
        tar.addfile(info)
    data = dockerfile_text.encode()
    info = tarfile.TarInfo(_DOCKERFILE_NAME)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))
  out.seek(0)


def _tag(name: str, digest: str) -> str:
  safe = re.sub(r'[^a-z0-9_.-]+', '-', name.lower()).strip('.-')[:80] or 'task'
  return f'{REPOSITORY}:{safe}-{digest}'


def _stream_build(client, context: str, files: list[str], dockerfile_text: str, tag: str,
                  where: str, tail_steps: int) -> list[str]:
  """Builds, keeping the streamed log; a failure names its step and ends with the log.
  Returns the (short) ids of the images that ended the stages before the last one."""
  log, step, number, steps = [], '', 0, 0
  stage_ends, last_id, in_stage = [], None, False
  with tempfile.TemporaryFile() as context_tar:
    _context_tar(context, files, dockerfile_text, context_tar)
    try:
      for chunk in client.api.build(fileobj=context_tar, custom_context=True,
                                    dockerfile=_DOCKERFILE_NAME, tag=tag, rm=True,
                                    forcerm=True, pull=False, decode=True):
        text = chunk.get('stream', '')
        log.append(text)
        if match := re.match(r'Step (\d+)/(\d+) : (.*)', text):
          step, number, steps = match.group(0), int(match.group(1)), int(match.group(2))
          if match.group(3).upper().startswith('FROM '):
            if in_stage and last_id:
              stage_ends.append(last_id)
            in_stage = True
        elif match := re.match(r' ---> ([0-9a-f]{12,})\s*$', text):
          last_id = match.group(1)
        if 'error' in chunk or 'errorDetail' in chunk:
          message = chunk.get('error') or chunk['errorDetail'].get('message', '')
          raise ImageBuildError(_failure(where, message, step, number, steps, tail_steps,
                                         log))
    except docker.errors.APIError as e:  # refused before any step ran (a parse error)
      raise ImageBuildError(_failure(where, e.explanation or str(e), step, number, steps,
                                     tail_steps, log)) from e
  return stage_ends


def _remove_stage_images(client, image_ids: list[str], bases: list[str | None]) -> None:
  """Removes the untagged images the legacy builder leaves for a multi-stage build's
  earlier stages (never a base, a tagged image, or one a later stage builds on: the
  engine refuses that, and the refusal is ignored)."""
  for image_id in image_ids:
    try:
      attrs = client.api.inspect_image(image_id)
      if attrs['Id'] in bases or [t for t in attrs.get('RepoTags') or []
                                  if t != '<none>:<none>']:
        continue
      client.api.remove_image(attrs['Id'])
    except docker.errors.APIError as e:  # gone already, or in use
      logging.info('Left the stage image %s: %s', image_id, e)


def _failure(where, message, step, number, steps, tail_steps, log) -> str:
  if not step:
    said = f'the engine refused it before any step ran: {message.strip()}'
  elif number > steps - tail_steps:  # its command is long: the log's end says why
    said = (f'c2jax\'s own step {number}/{steps} (making {sandbox_base.WORKDIR} the image\'s '
            'WORKDIR) failed')
  else:
    said = f'{step} failed: {message.strip()}'
  tail = re.sub(r'\x1b\[[0-9;]*m', '', ''.join(log))[-_LOG_TAIL_CHARS:]  # no colours
  return f'Building {where} failed: {said}\n--- end of the build log ---\n{tail}'


def build_task_image(context: str, name: str, dockerfile: str = 'Dockerfile', *,
                     base_images: Mapping[str, str] | None = None, client=None) -> TaskImage:
  """Builds `context`/`dockerfile` (once: see Caching) and returns its image. `name` (the
  task's id) starts the tag; `client` is a docker.DockerClient (else one from the
  environment, DOCKER_HOST). Raises BaseImageError for a FROM that cannot be resolved and
  ImageBuildError for a failed build (the step and the end of the log)."""
  where = f'{os.path.join(context, dockerfile)} (task {name})'
  with open(os.path.join(context, dockerfile), encoding='utf-8') as f:
    original = f.read()
  own_client = client is None
  if own_client:
    try:
      client = docker.from_env()
      client.ping()
    except docker.errors.DockerException as e:
      raise ImageBuildError(
          f'{where}: building it needs a docker engine, and none answers ({e}); start one '
          '(`bash tools/setup.sh` as root) or load the task without building its image.'
      ) from e
  try:
    text, bases, ids, tail_steps = _rewrite(original, client, dict(base_images or {}), where)
    files = _context_files(context, dockerfile)
    tag = _tag(name, _context_hash(context, files, text, ids))
    built = _local_id(client, tag) is None
    if built:
      logging.info('Building %s as %s', where, tag)
      stage_ends = _stream_build(client, context, files, text, tag, where, tail_steps)
      _remove_stage_images(client, stage_ends, ids)
    config = client.images.get(tag).attrs.get('Config') or {}
  finally:
    if own_client:
      client.close()
  return TaskImage(tag=tag, workdir=config.get('WorkingDir') or '/', bases=bases, built=built)
