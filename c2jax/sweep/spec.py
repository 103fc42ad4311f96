"""A sweep: one verb and base config, a grid or list of config overrides, the metrics to read.

A sweep file in experiments/sweeps/ defines `get_sweep(arg=None) -> Sweep` (as a config
file defines `get_config(arg)`); `experiments/sweeps/<file>.py:<arg>` picks a variant of it:

    def get_sweep(arg=None):
      return sweep.Sweep(
          verb="pretrain", config="configs/pretrain.py:tiny",
          fixed={"train.steps": 20},                                   # every point
          grid={"train.learning_rate": [1e-3, 3e-3], "model.hidden_size": [32, 64]},
          metrics={"eval_loss": sweep.last("eval_loss")})

`points=[{...}, ...]` lists points instead of a grid (ties several keys together, e.g. a
model-size ladder). Every override is checked against the base config before anything
launches: an unknown key or a value of the wrong type names the point and the key.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import itertools
import json
import pathlib
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from c2jax import config as configlib
from c2jax.sweep import metrics as metrics_lib
from c2jax.verbs import VERBS


# The table's own columns (c2jax/sweep/table.py); metrics may not reuse them.
RESERVED_COLUMNS = frozenset({"point", "status", "seconds", "run_dir", "log"})


class SweepError(ValueError):
  """A sweep file or its overrides are wrong; the message says which and how to fix it."""


@dataclasses.dataclass(frozen=True)
class Sweep:
  verb: str                      # the `c2jax <verb>` each point runs
  config: str                    # "configs/<file>.py[:arg]", relative to the repo or cwd
  metrics: Mapping[str, metrics_lib.Metric]
  grid: Mapping[str, Sequence] | None = None     # product of every axis' values
  points: Sequence[Mapping[str, Any]] | None = None  # or an explicit list of points
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  # How a point's run directory reaches the verb; `{run_dir}` is substituted.
  run_args: tuple[str, ...] = ("--workdir={run_dir}",)


@dataclasses.dataclass(frozen=True)
class Point:
  name: str                     # the run directory's name, derived from `swept`
  swept: dict[str, Any]         # the overrides that differ between points (the axes)
  overrides: dict[str, Any]     # everything set on the base config: fixed + swept + --set
  config: ml_collections.ConfigDict  # the base config with `overrides` applied

  def identity(self, verb: str, config_spec: str) -> dict:
    """What a run directory pins: a rerun with anything else is refused."""
    return {"verb": verb, "config": config_spec,
            "overrides": {k: _jsonable(v) for k, v in sorted(self.overrides.items())}}


@dataclasses.dataclass(frozen=True)
class Plan:
  """A loaded sweep with its points expanded and validated."""
  sweep: Sweep
  source: pathlib.Path           # the sweep file
  config_path: pathlib.Path      # the base config file, absolute
  config_arg: str | None
  axes: tuple[str, ...]          # swept keys, in the sweep's order
  points: tuple[Point, ...]

  @property
  def config_spec(self) -> str:
    return str(self.config_path) + (f":{self.config_arg}" if self.config_arg is not None else "")

  def command(self, point: Point, run_dir: pathlib.Path, python: str | None = None) -> list[str]:
    """The point's own process: `c2jax <verb> --config=... --config.k=v ... <run_args>`."""
    args = [python or sys.executable, "-m", "c2jax.cli", self.sweep.verb,
            f"--config={self.config_spec}"]
    args += [f"--config.{key}={format_value(value)}" for key, value in point.overrides.items()]
    args += [arg.format(run_dir=run_dir) for arg in self.sweep.run_args]
    return args


def load(spec: str, extra: Sequence[str] = ()) -> Plan:
  """Loads `path/to/sweep.py[:arg]`, expands its points and checks every override.

  `extra` holds "key=value" strings (the `--set` flag) applied to every point.
  """
  path_text, arg = _split_arg(spec)
  source = pathlib.Path(path_text).expanduser().resolve()
  if not source.is_file():
    raise SweepError(f"sweep file {path_text} does not exist.")
  module_spec = importlib.util.spec_from_file_location(f"c2jax_sweep_{source.stem}", source)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except Exception as err:  # the user's file: report it as theirs, not as a crash of ours
    raise SweepError(f"{source} failed to load: {type(err).__name__}: {err}") from err
  if not callable(getattr(module, "get_sweep", None)):
    raise SweepError(f"{source} has no get_sweep(arg=None) function returning a c2jax.sweep.Sweep.")
  try:
    sweep = module.get_sweep(arg) if arg is not None else module.get_sweep()
  except Exception as err:
    raise SweepError(f"{source}: get_sweep({arg!r}) raised {type(err).__name__}: {err}") from err
  if not isinstance(sweep, Sweep):
    raise SweepError(f"{source}: get_sweep returned {type(sweep).__name__}, not a c2jax.sweep.Sweep.")
  return expand(sweep, source, extra)


def expand(sweep: Sweep, source: pathlib.Path, extra: Sequence[str] = ()) -> Plan:
  _check_shape(sweep, source)
  config_path, config_arg = _resolve_config(sweep.config, source)
  try:
    base = configlib.load_config_file(config_path, config_arg)
  except Exception as err:
    raise SweepError(f"{source}: config={sweep.config!r} failed to load: "
                     f"{type(err).__name__}: {err}") from err
  raw_points = (list(sweep.points) if sweep.points is not None else
                [dict(zip(sweep.grid, values)) for values in
                 itertools.product(*sweep.grid.values())])
  axes = _axes(sweep, raw_points)
  shown = _short_names(axes)
  for name in set(sweep.metrics) & set(axes):
    raise SweepError(f"{source}: metrics[{name!r}] has the name of a swept key; rename it.")
  command_line = parse_assignments(extra, base)
  for key in command_line:
    if key in axes:
      raise SweepError(f"--set {key}=...: {source.name} sweeps config.{key}; a value for "
                       "every point would make them all the same point.")
  points, names = [], {}
  for index, raw in enumerate(raw_points):
    if not isinstance(raw, Mapping):
      raise SweepError(f"{source}: point {index} is {type(raw).__name__}, not a dict of overrides.")
    swept = {key: raw[key] for key in axes if key in raw}
    name = point_name(swept, shown)
    overrides = {**sweep.fixed, **raw, **command_line}  # later wins
    config = _apply(base, overrides, f"point {name} (number {index}) of {source.name}")
    if name in names:
      raise SweepError(f"{source}: points {names[name]} and {index} are the same point ({name}).")
    names[name] = index
    points.append(Point(name, swept, overrides, config))
  _check_stages(sweep, source, points)
  return Plan(sweep, source, config_path, config_arg, axes, tuple(points))


def _check_stages(sweep: Sweep, source: pathlib.Path, points: list[Point]) -> None:
  """A metric with stage= reads one stage of a pipeline point: every point must run it."""
  for name, metric in sweep.metrics.items():
    if not isinstance(metric, metrics_lib.InStage):
      continue
    if sweep.verb != "pipeline":
      raise SweepError(f"{source}: metrics[{name!r}] reads stage {metric.stage!r}, but the "
                       f"points run `c2jax {sweep.verb}`, not a pipeline; drop stage= or use "
                       "verb='pipeline'.")
    for point in points:
      stages = tuple(point.config.get("stages", ()))
      if metric.stage not in stages:
        raise SweepError(f"{source}: metrics[{name!r}] reads stage {metric.stage!r}, which "
                         f"point {point.name} does not run (its stages are {stages}).")


def _check_shape(sweep: Sweep, source: pathlib.Path) -> None:
  if (sweep.grid is None) == (sweep.points is None):
    raise SweepError(f"{source}: give exactly one of grid= (a product) or points= (a list).")
  if sweep.grid is not None:
    for key, values in sweep.grid.items():
      if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise SweepError(f"{source}: grid[{key!r}] must be a non-empty list of values.")
  elif not sweep.points:
    raise SweepError(f"{source}: points= is empty.")
  if not sweep.metrics:
    raise SweepError(f"{source}: metrics= is empty; name what to collect from each run.")
  for name, metric in sweep.metrics.items():
    if name in RESERVED_COLUMNS:
      raise SweepError(f"{source}: metrics[{name!r}]: the table has its own column of that "
                       f"name ({sorted(RESERVED_COLUMNS)}); rename the metric.")
    if not isinstance(metric, metrics_lib.Metric):
      raise SweepError(f"{source}: metrics[{name!r}] is {type(metric).__name__}; use "
                       "c2jax.sweep.last/minimum/maximum/at_step/from_json/... to build it.")
  if not any("{run_dir}" in arg for arg in sweep.run_args):
    raise SweepError(f"{source}: run_args must pass the run directory, e.g. "
                     "('--workdir={run_dir}',).")
  if sweep.verb not in VERBS or sweep.verb == "sweep":
    verbs = sorted(v for v in VERBS if v != "sweep")
    raise SweepError(f"{source}: verb={sweep.verb!r} is not a c2jax verb ({verbs}).")


def _split_arg(spec: str) -> tuple[str, str | None]:
  path, sep, arg = spec.rpartition(":")
  if sep and path.endswith(".py"):
    return path, arg
  return spec, None


def _resolve_config(spec: str, source: pathlib.Path) -> tuple[pathlib.Path, str | None]:
  """The base config path: as given, else relative to the repo holding the sweep file."""
  path_text, arg = _split_arg(spec)
  candidates = [pathlib.Path(path_text).expanduser()]
  candidates += [parent / path_text for parent in source.parents]
  for candidate in candidates:
    if candidate.is_file():
      return candidate.resolve(), arg
  raise SweepError(f"{source}: config={spec!r}: no file {path_text} here or above the sweep file.")


def _axes(sweep: Sweep, raw_points: list) -> tuple[str, ...]:
  """The keys whose values differ between points (a grid's axes of one value are kept)."""
  if sweep.grid is not None:
    return tuple(sweep.grid)
  keys = list(dict.fromkeys(key for raw in raw_points if isinstance(raw, Mapping) for key in raw))
  varying = [key for key in keys
             if len({json.dumps(_jsonable(raw.get(key)), sort_keys=True) for raw in raw_points
                     if isinstance(raw, Mapping)}) > 1]
  return tuple(varying)


def _short_names(keys: Sequence[str]) -> dict[str, str]:
  """Each dotted key's shortest suffix that no other key ends with (train.learning_rate ->
  learning_rate unless another key also ends in learning_rate)."""
  short = {}
  for key in keys:
    parts = key.split(".")
    for n in range(1, len(parts) + 1):
      suffix = ".".join(parts[-n:])
      if not any(other != key and (other == suffix or other.endswith("." + suffix))
                 for other in keys):
        break
    short[key] = suffix
  return short


_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


def point_name(swept: Mapping[str, Any], shown: Mapping[str, str]) -> str:
  """A stable, readable directory name; a hash is added when characters had to be replaced
  or the name is long, so different points never share a directory."""
  if not swept:
    return "base"
  readable = ",".join(f"{shown[key]}={_value_text(value)}" for key, value in swept.items())
  safe = _UNSAFE.sub("_", readable)
  if safe == readable and len(safe) <= 120:
    return safe
  digest = hashlib.sha1(json.dumps({k: _jsonable(v) for k, v in swept.items()},
                                   sort_keys=True).encode()).hexdigest()[:8]
  return f"{safe[:110]}-{digest}"


def _value_text(value) -> str:
  if isinstance(value, float):
    return f"{value:g}"
  if isinstance(value, (tuple, list)):
    return "+".join(_value_text(v) for v in value)
  return str(value)


def _apply(base: ml_collections.ConfigDict, overrides: Mapping[str, Any], where: str):
  config = base.copy_and_resolve_references()
  for key, value in overrides.items():
    node, parts = config, key.split(".")
    for depth, part in enumerate(parts):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        known = (", ".join(sorted(node.keys())) if isinstance(node, ml_collections.ConfigDict)
                 else "none: it is a value, not a group")
        raise SweepError(f"{where}: config.{key} is not a key of the base config "
                         f"(config.{'.'.join(parts[:depth]) or '<top>'} has: {known}).")
      if depth < len(parts) - 1:
        node = node[part]
    if isinstance(node[parts[-1]], ml_collections.ConfigDict):
      raise SweepError(f"{where}: config.{key} is a group of keys; override its fields instead.")
    if value is None:
      raise SweepError(f"{where}: config.{key} = None cannot be passed on a command line.")
    try:
      node[parts[-1]] = value
    except (TypeError, ValueError) as err:
      raise SweepError(f"{where}: config.{key} = {value!r}: {err}") from None
  return config


def parse_assignments(assignments: Sequence[str], base: ml_collections.ConfigDict) -> dict:
  """"key=value" strings -> typed values, read as the base config's field type."""
  values = {}
  for text in assignments:
    key, sep, raw = text.partition("=")
    key = key.strip().removeprefix("config.")
    if not sep or not key:
      raise SweepError(f"--set {text!r}: expected KEY=VALUE, e.g. --set train.steps=10.")
    try:
      current = configlib.get(base, key)
    except configlib.ConfigError:
      raise SweepError(f"--set {text!r}: config.{key} is not a key of the base config.") from None
    if isinstance(current, str) or current is None:
      values[key] = raw
    elif isinstance(current, bool):
      if raw.lower() not in ("true", "false", "1", "0"):
        raise SweepError(f"--set {text!r}: config.{key} is a bool; use true or false.")
      values[key] = raw.lower() in ("true", "1")
    else:
      try:
        values[key] = ast.literal_eval(raw)
      except (ValueError, SyntaxError):
        raise SweepError(f"--set {text!r}: {raw!r} is not a {type(current).__name__}.") from None
  return values


def format_value(value) -> str:
  """A value as absl's --config.<key>= parser reads it back."""
  if isinstance(value, str):
    return value
  if isinstance(value, float):
    return repr(value)
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  return str(value)


def _jsonable(value):
  if isinstance(value, (tuple, list)):
    return [_jsonable(v) for v in value]
  return value
