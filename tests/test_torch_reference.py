"""The live-comparison interpreter: skipped with instructions when unset, refused when
the variable names no file, and probed for the modules a test needs."""

import sys

import pytest

from tests import torch_reference


def test_unset_skips_and_says_how_to_enable(monkeypatch):
  monkeypatch.delenv(torch_reference.ENV, raising=False)
  with pytest.raises(pytest.skip.Exception) as skipped:
    torch_reference.torch_python()
  message = str(skipped.value)
  assert "set C2JAX_TORCH_PYTHON to a Python with torch and transformers" in message
  assert "pip install torch==2.13.0 transformers safetensors" in message


def test_a_path_that_is_no_file_fails(monkeypatch, tmp_path):
  monkeypatch.setenv(torch_reference.ENV, str(tmp_path / "missing" / "python"))
  with pytest.raises(pytest.fail.Exception, match="is not a file"):
    torch_reference.torch_python()


def test_an_interpreter_without_the_modules_skips_naming_them(monkeypatch):
  monkeypatch.setenv(torch_reference.ENV, sys.executable)
  with pytest.raises(pytest.skip.Exception, match="cannot import json, no_such_module_c2jax"):
    torch_reference.torch_python("json", "no_such_module_c2jax")
  assert torch_reference.torch_python("json") == sys.executable
