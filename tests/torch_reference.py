"""The interpreter every live comparison against torch / transformers runs in.

torch and transformers are not c2jax dependencies: committed fixtures (tests/fixtures/hf,
templates, quant) hold their outputs, and the live tests regenerate or compare them in
another Python, named by one variable, C2JAX_TORCH_PYTHON (README, "HF reference
fixtures"). Unset, the live tests skip and say how to enable them; set to a path that is
not an interpreter, they fail (a live run was asked for).
"""

import os
import pathlib
import subprocess
import tempfile

import pytest

ENV = "C2JAX_TORCH_PYTHON"
HOW = (f"set {ENV} to a Python with torch and transformers to run it, e.g. a Python 3.11 "
       "venv: `python3.11 -m venv ~/.venvs/torch && ~/.venvs/torch/bin/pip install "
       "torch==2.13.0 transformers safetensors tiktoken compressed-tensors && "
       f"export {ENV}=~/.venvs/torch/bin/python`")


def clean_env() -> dict:
  """This environment without PYTHONPATH: the checkout's top-level `kernels` package would
  shadow the hub `kernels` library that transformers probes for."""
  return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def torch_python(*modules: str) -> str:
  """The path in $C2JAX_TORCH_PYTHON, checked to import `modules` (default torch and
  transformers); skips the calling test with how to enable it when unset or when a
  module is missing, fails when the path is not there."""
  modules = modules or ("torch", "transformers")
  python = os.environ.get(ENV, "")
  if not python:
    pytest.skip(f"live comparison with transformers: {HOW}.")
  python = os.path.expanduser(python)
  if not pathlib.Path(python).is_file():
    pytest.fail(f"{ENV}={python} is not a file; point it at a Python interpreter ({HOW}), "
                f"or unset {ENV} to skip the live comparisons.")
  with tempfile.TemporaryDirectory() as away:  # not the checkout: see clean_env
    probe = subprocess.run([python, "-c", "import " + ", ".join(modules)],
                           capture_output=True, text=True, timeout=300, cwd=away,
                           env=clean_env())
  if probe.returncode:
    last = (probe.stderr.strip().splitlines() or ["(no error output)"])[-1]
    pytest.skip(f"{ENV}={python} cannot import {', '.join(modules)} ({last}); {HOW}.")
  return python
