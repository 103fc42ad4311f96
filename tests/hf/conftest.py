"""Shared fixtures of the HF interop tests: the committed fixture cases and their loads."""

from __future__ import annotations

import pathlib

import pytest

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").exists())


@pytest.fixture(scope="session")
def loaded():
  """case -> (cfg, params) loaded once per session through c2jax.hf.load."""
  from c2jax import hf
  cache = {}

  def get(case: str):
    if case not in cache:
      cache[case] = hf.load(FIXTURES / case)
    return cache[case]

  return get
