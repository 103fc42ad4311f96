#!/usr/bin/env bash
# Creates ./.venv-gpu: c2jax with the gpu-compile extra (XLA's GPU compiler, the CUDA
# plugin), for `c2jax plan --memory --target=h100-8` on a machine without a GPU. A venv of
# its own because, with the CUDA plugin installed, every JAX process looks for a GPU at start.
# Uses the interpreter of ./.venv (run tools/setup.sh first). Idempotent.
#   bash tools/setup_gpu_compile.sh
#   JAX_PLATFORMS=cpu .venv-gpu/bin/c2jax plan --memory --config=configs/pretrain.py:tiny --target=h100-8
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "setup_gpu_compile.sh: run tools/setup.sh first (it makes .venv)" >&2; exit 1; }
if [ ! -x .venv-gpu/bin/python ]; then
  base=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
  echo "setup_gpu_compile.sh: creating .venv-gpu with $base"
  "$base" -m venv .venv-gpu
fi
.venv-gpu/bin/python -m pip install -q --upgrade pip
jax_version=$(.venv/bin/python -c 'import jax; print(jax.__version__)')
.venv-gpu/bin/python -m pip install -q -e ".[gpu-compile,kernels]" "jax==$jax_version" "jaxlib==$jax_version"
echo "setup_gpu_compile.sh: ready (.venv-gpu/bin/c2jax; tests: export C2JAX_GPU_COMPILE_PYTHON=\$PWD/.venv-gpu/bin/python)"
