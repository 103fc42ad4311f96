#!/usr/bin/env bash
# Wheels for the lent GPU machine, whose image has JAX (CUDA 13), flax, optax, orbax and
# PyTorch but not everything c2jax and tokamax import, and which cannot reach a package
# registry. Downloads, for CPython 3.12 on x86-64 Linux, the packages below at the
# versions installed in this checkout's .venv (so the GPU runs what the suite tested) into
# .whl/ (git-ignored), about 42 MB. gpu_all.sh installs them from there when the folder
# exists; the device tool carries it with `carry: [".whl"]`.
#   bash tools/device/wheels.sh          # from the repo root, after tools/setup.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
# c2jax's imports the image lacks, then tokamax's own.
PACKAGES="grain array_record ml_collections portpicker tokamax einshape qwix immutabledict
  pydantic pydantic_core annotated_types typing_inspection tensorboardX xprof fire
  termcolor gviz_api"
pins=()
for name in $PACKAGES; do
  version=$("$PY" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  [ -n "$version" ] || { echo "wheels.sh: $name is not installed in .venv (run tools/setup.sh)" >&2; exit 1; }
  pins+=("$name==$version")
done
rm -rf .whl && mkdir -p .whl
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
    manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$tag")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d .whl "${pins[@]}"
du -sh .whl
