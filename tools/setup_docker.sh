#!/usr/bin/env bash
# The container engine of the docker sandbox backend and its image, for tools/setup.sh.
#
# Idempotent, and never fails the set-up: where Docker cannot be installed or started (not
# root, no apt, no privileges), it says so and returns 0; the docker backend's tests then
# run against their fake engine only.
#   1. A reachable engine (`docker info`) is used as it is.
#   2. Else, as root with apt: installs docker.io (and btrfs-progs, mmdebstrap) where
#      dockerd is missing, and starts dockerd in the background (no systemd needed), its
#      storage on a btrfs file system in a sparse image file (C2JAX_DOCKER_DISK_GB, default
#      32; it takes host space only as it fills), so that per-container disk quotas
#      (`--storage-opt size=`, the sandbox's disk_mb) are enforced: overlay2, the default
#      driver, enforces them only on xfs with project quotas, which many kernels lack.
#      Btrfs's simple quotas where the kernel has them (c2jax/env/btrfs.py).
#      Log: /var/log/c2jax-dockerd.log.
#   3. Builds the sandbox image $C2JAX_DOCKER_IMAGE (default c2jax-sandbox:bookworm) unless
#      it exists at this script's recipe ($RECIPE, its c2jax.sandbox label): a minimal
#      Debian root file system (mmdebstrap's minbase variant from the apt sources' mirror:
#      apt, useradd; with python3, pytest, pip and procps, pip allowed to install into the
#      system Python as in the python:3 images; the host's added CA certificates trusted;
#      about 200 MB), imported with
#      `docker import`; no image registry is needed. Task Dockerfiles' RUN steps use apt-get
#      and pip in it as they would in their python / debian / ubuntu bases.
set -uo pipefail

IMAGE=${C2JAX_DOCKER_IMAGE:-c2jax-sandbox:bookworm}
# The image's recipe: a change to the build below bumps it, and an image of an older
# recipe is built again.
RECIPE=2
# The CA certificates added to this host (update-ca-certificates' own folder) are trusted
# in the image too, so that RUN steps reach the registries through the same TLS proxy the
# host goes through.
LOCAL_CAS=/usr/local/share/ca-certificates
CA_HOOK='if ls '$LOCAL_CAS'/*.crt >/dev/null 2>&1; then mkdir -p "$1'$LOCAL_CAS'" &&
  cp '$LOCAL_CAS'/*.crt "$1'$LOCAL_CAS'/" && chroot "$1" update-ca-certificates >/dev/null; fi'
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA_ROOT=/var/lib/c2jax-docker
DISK_IMAGE=/var/lib/c2jax-docker.btrfs
LOG=/var/log/c2jax-dockerd.log

say() { echo "setup_docker.sh: $*" >&2; }

engine_up() { timeout 20 docker info >/dev/null 2>&1; }

mirror() {
  # The first Debian mirror apt is configured with (deb822 or one-line sources).
  local uri
  uri=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null |
        grep -v security | head -1 | sed -E 's/^URIs: *//; s/^deb (\[[^]]*\] )?//' | awk '{print $1}')
  echo "${uri:-http://deb.debian.org/debian}"
}

start_engine() {
  if [ "$(id -u)" != 0 ]; then
    say "no Docker engine reachable and not root: not starting one (docker sandbox tests use the fake engine)"
    return 1
  fi
  if [ -f /var/run/docker.pid ] && kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    say "a dockerd is running (pid $(cat /var/run/docker.pid)) but does not answer" \
        "${DOCKER_HOST:-at /var/run/docker.sock}; not starting another"
    return 1
  fi
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v mkfs.btrfs >/dev/null 2>&1 ||
     ! command -v mmdebstrap >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
      say "dockerd is missing and there is no apt-get to install it; skipping Docker"
      return 1
    fi
    say "installing docker.io, btrfs-progs and mmdebstrap"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        docker.io btrfs-progs mmdebstrap >/dev/null; } ||
      { say "apt-get could not install docker.io; skipping Docker"; return 1; }
  fi
  mkdir -p "$DATA_ROOT"
  if ! mountpoint -q "$DATA_ROOT"; then
    if [ ! -f "$DISK_IMAGE" ]; then
      truncate -s "${C2JAX_DOCKER_DISK_GB:-32}G" "$DISK_IMAGE" && mkfs.btrfs -q "$DISK_IMAGE" >/dev/null ||
        { say "could not make the btrfs image $DISK_IMAGE"; rm -f "$DISK_IMAGE"; }
    fi
    if ! mount -o loop,discard "$DISK_IMAGE" "$DATA_ROOT" 2>/dev/null; then
      say "could not mount $DISK_IMAGE (no loop devices?); dockerd keeps its default storage," \
          "where sandbox disk quotas may not be enforced"
    fi
  fi
  local driver=()
  if mountpoint -q "$DATA_ROOT"; then
    # Simple quotas where the kernel has them (6.7+): a container's size counts what it
    # writes, and deleting one costs the kernel no walk over its image's extents
    # (c2jax/env/btrfs.py); else full quota groups.
    local mode
    if [ -x "$REPO/.venv/bin/python" ] &&
       mode=$(cd "$REPO" && .venv/bin/python -m c2jax.env.btrfs simple "$DATA_ROOT" 2>&1); then
      say "btrfs quotas on $DATA_ROOT: $mode"
    else
      say "no btrfs simple quotas (${mode:-no .venv to set them}); full quota groups instead"
      btrfs quota enable "$DATA_ROOT" 2>/dev/null
    fi
    driver=(--storage-driver btrfs)
  fi
  say "starting dockerd (log: $LOG)"
  nohup dockerd --data-root "$DATA_ROOT" "${driver[@]}" >>"$LOG" 2>&1 &
  for _ in $(seq 60); do
    engine_up && return 0
    kill -0 $! 2>/dev/null || break
    sleep 1
  done
  say "dockerd did not start (see $LOG; containers need root and cgroups); skipping Docker"
  return 1
}

build_image() {
  if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    local recipe
    recipe=$(docker image inspect -f '{{index .Config.Labels "c2jax.sandbox"}}' "$IMAGE" 2>/dev/null)
    if [ "$recipe" = "$RECIPE" ]; then
      say "image $IMAGE exists"
      return 0
    fi
    say "image $IMAGE is of an older recipe (${recipe:-none}, now $RECIPE); building it again"
  fi
  if ! command -v mmdebstrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] &&
     command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        mmdebstrap >/dev/null; } || say "apt-get could not install mmdebstrap"
  fi
  if ! command -v mmdebstrap >/dev/null 2>&1; then
    say "mmdebstrap is missing (apt-get install mmdebstrap); cannot build $IMAGE"
    return 1
  fi
  local log start=$SECONDS
  log=$(mktemp /var/tmp/c2jax-image-XXXXXX.log)
  say "building $IMAGE from $(mirror) (mmdebstrap; a minute or more)"
  # Debian's minbase (essential packages, apt, the required ones such as passwd) plus what
  # sandboxed commands and task Dockerfiles need; no documentation, and no fsync (a
  # throwaway tree: dpkg's syncing is most of its time on a busy disk). Without
  # EXTERNALLY-MANAGED, `pip install` goes into the system Python, as in python:3 images.
  if ! mmdebstrap --variant=minbase \
       --include=python3,python3-pytest,python-is-python3,python3-pip,ca-certificates,procps \
       --dpkgopt=force-unsafe-io --dpkgopt='path-exclude=/usr/share/doc/*' \
       --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
       --dpkgopt='path-exclude=/usr/share/info/*' \
       --customize-hook='mkdir -p "$1/workspace"; rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
       --customize-hook="$CA_HOOK" \
       bookworm - "$(mirror)" 2>"$log" |
     docker import \
       --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
       --change "LABEL c2jax.sandbox=$RECIPE" \
       --change 'WORKDIR /workspace' --change 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null; then
    say "building $IMAGE failed (see $log)"
    docker image rm "$IMAGE" >/dev/null 2>&1
    return 1
  fi
  rm -f "$log"
  say "built $IMAGE in $((SECONDS - start)) s"
}

if ! engine_up && ! start_engine; then
  exit 0
fi
build_image || say "the docker sandbox backend has no image; its tests use the fake engine"
exit 0
