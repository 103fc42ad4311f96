"""Config validation shared by every job: errors that name the offending key.

ml-collections already rejects unknown keys and wrong types on `--config.<key>=...`
overrides; `check_*` helpers here cover what it cannot: values outside a registry,
inconsistent dimensions, and configs built in Python with unknown fields. Every job's
`validate` runs before anything is traced or compiled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections


class ConfigError(ValueError):
  """A config value is missing, unknown, of the wrong type or inconsistent.

  The message always starts with the dotted key so users can fix the right line.
  """

  def __init__(self, key: str, message: str):
    self.key = key
    super().__init__(f"config.{key}: {message}")


def get(cfg: ml_collections.ConfigDict, dotted: str) -> Any:
  node: Any = cfg
  for part in dotted.split("."):
    if not isinstance(node, (ml_collections.ConfigDict, Mapping)) or part not in node:
      raise ConfigError(dotted, "is missing; add it to the config file (see configs/).")
    node = node[part]
  return node


def check_choice(cfg, key: str, choices: Iterable[str]) -> None:
  value = get(cfg, key)
  choices = sorted(choices)
  if value not in choices:
    raise ConfigError(key, f"is {value!r}; expected one of {choices}.")


def check_positive(cfg, key: str, *, allow_zero: bool = False) -> None:
  value = get(cfg, key)
  ok = value >= 0 if allow_zero else value > 0
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok:
    bound = ">= 0" if allow_zero else "> 0"
    raise ConfigError(key, f"is {value!r}; must be a number {bound}.")


def check_divides(cfg, key: str, divisor_key: str) -> None:
  value, divisor = get(cfg, key), get(cfg, divisor_key)
  if divisor <= 0 or value % divisor:
    raise ConfigError(
        key, f"= {value} must be divisible by config.{divisor_key} = {divisor}.")


def check_at_most(cfg, key: str, bound_key: str) -> None:
  value, bound = get(cfg, key), get(cfg, bound_key)
  if value > bound:
    raise ConfigError(key, f"= {value} must be <= config.{bound_key} = {bound}.")


def check_keys(cfg: ml_collections.ConfigDict, reference: ml_collections.ConfigDict,
               prefix: str = "") -> None:
  """Every key in `cfg` must exist in `reference` with a compatible type (recursively)."""
  for key in cfg.keys():
    dotted = f"{prefix}{key}"
    if key not in reference:
      known = ", ".join(sorted(reference.keys()))
      raise ConfigError(dotted, f"is not a known key (known here: {known}).")
    value, ref_value = cfg[key], reference[key]
    if isinstance(ref_value, ml_collections.ConfigDict):
      if not isinstance(value, ml_collections.ConfigDict):
        raise ConfigError(dotted, f"must be a group of keys, got {type(value).__name__}.")
      check_keys(value, ref_value, dotted + ".")
    elif ref_value is not None and value is not None:
      if not _compatible(value, ref_value):
        raise ConfigError(
            dotted, f"has type {type(value).__name__}; expected {type(ref_value).__name__}.")


def _compatible(value, ref_value) -> bool:
  if isinstance(ref_value, bool) or isinstance(value, bool):
    return isinstance(value, bool) and isinstance(ref_value, bool)
  if isinstance(ref_value, float):
    return isinstance(value, (int, float))
  if isinstance(ref_value, (tuple, list)):
    return isinstance(value, (tuple, list))
  return isinstance(value, type(ref_value))


def load_config_file(path, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of a config file by path (how config files build on each other)."""
  import importlib.util
  import pathlib

  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"config file {path} does not exist.")
  spec = importlib.util.spec_from_file_location(f"c2jax_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg is not None else module.get_config()


def apply_overrides(cfg: ml_collections.ConfigDict, values: Mapping, prefix: str = "") -> None:
  """Sets nested `values` (a dict of dicts) on `cfg`; an unknown key is a ConfigError."""
  for key, value in values.items():
    if key not in cfg:
      raise ConfigError(prefix + key, "is not a key of this config.")
    if isinstance(value, Mapping):
      apply_overrides(cfg[key], value, f"{prefix}{key}.")
    else:
      cfg[key] = value
