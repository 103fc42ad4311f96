"""What a sweep reads from each finished point: one number (or string) per metric.

From the run's metrics.jsonl (c2jax/train/metrics.py): `last`, `minimum`, `maximum`,
`at_step`. From a JSON file the run wrote (an eval's summary.json): `from_json`. From the
point's own config: `config_value`, `tokens`, `active_params`, and training compute as
`compute_6nd` (6 x active parameters x tokens) or `train_flops` (the model's FLOP count
per token, attention included: c2jax.parallel.roofline.train_flops_per_token, x tokens).
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
import pathlib

import ml_collections

METRICS_FILE = "metrics.jsonl"


class MetricMissing(LookupError):
  """A finished run does not hold the value a metric asks for (the message says why)."""


class Metric(abc.ABC):
  """One column of the table: `collect` reads it for a finished point (or raises
  MetricMissing saying what is absent)."""

  @abc.abstractmethod
  def collect(self, run_dir: pathlib.Path, config: ml_collections.ConfigDict):
    """The value for the point run in `run_dir` with `config`."""


def _rows(run_dir: pathlib.Path) -> list[dict]:
  path = run_dir / METRICS_FILE
  if not path.exists():
    raise MetricMissing(f"{path} does not exist")
  rows = []
  for line in path.read_text().splitlines():
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      continue  # a line cut short by a kill
  return rows


def _number(value):
  if isinstance(value, str):  # the metrics writer stores nan/inf as strings
    try:
      return float(value)
    except ValueError:
      return value
  return value


def _series(run_dir: pathlib.Path, key: str) -> list[tuple[int, object]]:
  rows = _rows(run_dir)
  series = [(row.get("step", 0), _number(row[key])) for row in rows if key in row]
  if not series:
    known = sorted({k for row in rows for k in row} - {"step", "time"})
    raise MetricMissing(f"no row of {run_dir / METRICS_FILE} has {key!r} (it has {known})")
  return series


@dataclasses.dataclass(frozen=True)
class Last(Metric):
  key: str

  def collect(self, run_dir, config):
    return _series(run_dir, self.key)[-1][1]


@dataclasses.dataclass(frozen=True)
class Extreme(Metric):
  key: str
  largest: bool

  def collect(self, run_dir, config):
    values = [v for _, v in _series(run_dir, self.key)
              if isinstance(v, (int, float)) and math.isfinite(v)]
    if not values:
      raise MetricMissing(f"{self.key!r} has no finite value in {run_dir / METRICS_FILE}")
    return max(values) if self.largest else min(values)


@dataclasses.dataclass(frozen=True)
class AtStep(Metric):
  key: str
  step: int

  def collect(self, run_dir, config):
    matches = [v for s, v in _series(run_dir, self.key) if s == self.step]
    if not matches:
      raise MetricMissing(f"{self.key!r} was not logged at step {self.step} in "
                          f"{run_dir / METRICS_FILE}")
    return matches[-1]


@dataclasses.dataclass(frozen=True)
class FromJson(Metric):
  file: str   # relative to the run directory
  key: str    # dotted path into the JSON object

  def collect(self, run_dir, config):
    path = run_dir / self.file
    if not path.exists():
      raise MetricMissing(f"{path} does not exist")
    node = json.loads(path.read_text())
    for part in self.key.split("."):
      if not isinstance(node, dict) or part not in node:
        raise MetricMissing(f"{path} has no {self.key!r}")
      node = node[part]
    return node


@dataclasses.dataclass(frozen=True)
class ConfigValue(Metric):
  key: str

  def collect(self, run_dir, config):
    node = config
    for part in self.key.split("."):
      if part not in node:
        raise MetricMissing(f"the point's config has no {self.key!r}")
      node = node[part]
    return node


def _train_tokens(config) -> int:
  try:
    return config.train.steps * config.train.batch_size * config.train.seq_len
  except AttributeError:
    raise MetricMissing("the point's config has no train.steps/batch_size/seq_len; "
                        "compute metrics need a training job's config") from None


_SIZES: dict[tuple, float] = {}  # (what, model json, seq_len) -> value; counting traces


def _model_size(what: str, model: ml_collections.ConfigDict, seq_len: int = 0) -> float:
  key = (what, model.to_json(), seq_len)
  if key not in _SIZES:
    if what == "active_params":
      from c2jax.model import counting  # jax: only when a sweep asks for sizes

      _SIZES[key] = counting.count_params(model)["active_params"]
    else:
      from c2jax.parallel import roofline

      _SIZES[key] = roofline.train_flops_per_token(model, seq_len)
  return _SIZES[key]


@dataclasses.dataclass(frozen=True)
class Derived(Metric):
  """Sizes and training compute of the point's config (no run output needed)."""
  what: str  # tokens | active_params | compute_6nd | train_flops

  def collect(self, run_dir, config):
    if self.what == "tokens":
      return _train_tokens(config)
    if self.what == "active_params":
      return int(_model_size("active_params", config.model))
    if self.what == "compute_6nd":
      return 6.0 * _model_size("active_params", config.model) * _train_tokens(config)
    tokens = _train_tokens(config)
    return _model_size("flops_per_token", config.model, config.train.seq_len) * tokens


def last(key: str) -> Metric:
  """The last logged value of `key` in metrics.jsonl."""
  return Last(key)


def minimum(key: str) -> Metric:
  return Extreme(key, largest=False)


def maximum(key: str) -> Metric:
  return Extreme(key, largest=True)


def at_step(key: str, step: int) -> Metric:
  return AtStep(key, int(step))


def from_json(file: str, key: str) -> Metric:
  """A value in a JSON file of the run dir, e.g. from_json("summary.json", "overall.accuracy")."""
  return FromJson(file, key)


def config_value(key: str) -> Metric:
  return ConfigValue(key)


def tokens() -> Metric:
  """Training tokens: train.steps x train.batch_size x train.seq_len."""
  return Derived("tokens")


def active_params() -> Metric:
  return Derived("active_params")


def compute_6nd() -> Metric:
  """Training compute as 6 x active parameters x tokens."""
  return Derived("compute_6nd")


def train_flops() -> Metric:
  """Training compute as the model's FLOPs per token (forward + backward) x tokens."""
  return Derived("train_flops")
