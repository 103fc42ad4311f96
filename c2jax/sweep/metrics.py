"""What a sweep reads from each finished point: one number (or string) per metric.

From the run's metrics.jsonl (c2jax/train/metrics.py): `last`, `minimum`, `maximum`,
`at_step`. From a JSON file the run wrote (an eval's summary.json): `from_json`. From the
point's own config: `config_value`, `tokens`, `active_params`, and training compute as
`compute_6nd` (6 x active parameters x tokens) or `train_flops` (the model's FLOP count
per token, attention included: c2jax.plan.roofline.train_flops_per_token, x tokens).
`mean_tail` averages the last part of a series (e.g. RL reward over the last quarter).

A point of a `pipeline` sweep is a chain of stages (c2jax/pipeline.py), each in
RUN_DIR/<stage> with its own config section: every metric takes `stage=` to read that
stage's run and config, e.g. `last("eval_loss", stage="sft")`, `compute_6nd(stage="pretrain")`
or `last("eval/pass_rate", stage="rl")`; without it, the pipeline root (its summary.json).
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
class TailMean(Metric):
  """The mean of the finite values of `key` logged after the last `fraction` of the steps
  (at least the last logged step)."""
  key: str
  fraction: float

  def collect(self, run_dir, config):
    series = _series(run_dir, self.key)
    last_step = max(step for step, _ in series)
    tail = max(int(last_step * self.fraction), 1)
    values = [v for s, v in series if s > last_step - tail
              and isinstance(v, (int, float)) and math.isfinite(v)]
    if not values:
      raise MetricMissing(f"{self.key!r} has no finite value after step {last_step - tail} "
                          f"in {run_dir / METRICS_FILE}")
    return sum(values) / len(values)


@dataclasses.dataclass(frozen=True)
class InStage(Metric):
  """`metric` of one stage of a pipeline point: its run directory RUN_DIR/<stage> and its
  config section config.<stage>."""
  metric: Metric
  stage: str

  def collect(self, run_dir, config):
    if "stages" not in config or self.stage not in config:
      raise MetricMissing(f"the point's config has no stage {self.stage!r} (a stage metric "
                          "needs a pipeline config)")
    return self.metric.collect(pathlib.Path(run_dir) / self.stage, config[self.stage])


def _in(metric: Metric, stage: str | None) -> Metric:
  if stage is None:
    return metric
  if not isinstance(stage, str) or not stage or "/" in stage:
    raise ValueError(f"stage={stage!r}: name one pipeline stage, e.g. 'sft'.")
  return InStage(metric, stage)


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
      from c2jax.plan import roofline

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


def last(key: str, stage: str | None = None) -> Metric:
  """The last logged value of `key` in metrics.jsonl (of pipeline stage `stage`)."""
  return _in(Last(key), stage)


def minimum(key: str, stage: str | None = None) -> Metric:
  return _in(Extreme(key, largest=False), stage)


def maximum(key: str, stage: str | None = None) -> Metric:
  return _in(Extreme(key, largest=True), stage)


def at_step(key: str, step: int, stage: str | None = None) -> Metric:
  return _in(AtStep(key, int(step)), stage)


def mean_tail(key: str, fraction: float = 0.25, stage: str | None = None) -> Metric:
  """The mean of `key` over the last `fraction` of the run's steps (at least one step)."""
  if not 0 < fraction <= 1:
    raise ValueError(f"mean_tail({key!r}, fraction={fraction}): fraction must be in (0, 1].")
  return _in(TailMean(key, float(fraction)), stage)


def from_json(file: str, key: str, stage: str | None = None) -> Metric:
  """A value in a JSON file of the run dir, e.g. from_json("summary.json", "overall.accuracy")."""
  return _in(FromJson(file, key), stage)


def config_value(key: str, stage: str | None = None) -> Metric:
  return _in(ConfigValue(key), stage)


def tokens(stage: str | None = None) -> Metric:
  """Training tokens: train.steps x train.batch_size x train.seq_len."""
  return _in(Derived("tokens"), stage)


def active_params(stage: str | None = None) -> Metric:
  return _in(Derived("active_params"), stage)


def compute_6nd(stage: str | None = None) -> Metric:
  """Training compute as 6 x active parameters x tokens."""
  return _in(Derived("compute_6nd"), stage)


def train_flops(stage: str | None = None) -> Metric:
  """Training compute as the model's FLOPs per token (forward + backward) x tokens."""
  return _in(Derived("train_flops"), stage)
