"""Model config across phases: what a phase inherits from its checkpoint, what it may change.

A phase that starts from a checkpoint (`init_from`) runs the checkpoint's model. Its own
model section only says three things:
  - implementation and storage choices (FREE_KEYS below): always the phase's own;
  - overrides: a key whose value differs from the phase's variant table
    (`variants.get(model.name)`) was set on purpose, by the config file or the command
    line. An override that disagrees with the checkpoint is an error naming the key and
    both values;
  - declared changes: keys listed in `config.model_changes` always take the phase's
    value (the long-context phase declares its YaRN extension, the MTP phase its MTP
    module; a phase dropping MTP declares num_mtp_layers = 0);
  - everything else is inherited, so `configs/rl.py` on the `tiny` variant runs whatever
    the SFT checkpoint it starts from trained: YaRN included when the long-context phase
    set it.
A model whose `name` is not a variant (e.g. one read from an HF config.json) has no table
to compare with: every architecture key it states is then an override.

Architecture/numerics keys are every schema key not in FREE_KEYS, so a new model field is
protected by default; marking it free is a decision written down here with its reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import ml_collections

from c2jax import config as configlib
from c2jax.model import config as model_config

# Keys that change how the same function is computed or stored, never which function the
# checkpoint's parameters define; a later phase picks its own.
FREE_KEYS: dict[str, str] = {
    "name": "a label (the variant table overrides are measured against)",
    "max_position": "an upper bound checked against train.seq_len; RoPE reads "
                    "rope.original_max_position and rope.factor, not this",
    "init_std": "initialisation only; restored parameters ignore it (fresh MTP modules "
                "use the phase's value)",
    "param_dtype": "storage of the fp32/bf16 master weights; the restore casts",
    "opt_state_dtype": "storage of the optimizer moments; a new phase starts new moments",
    "attention_impl": "every attention_impl computes the same softmax(QK)V",
    "attention_block": "tile size of blockwise attention",
    "moe_impl": "dense, ragged and pallas dispatch compute the same expert mixture",
    "remat": "what the backward pass recomputes, not what it computes",
    "scan_unroll": "how the layer scan is unrolled",
    "moe.expert_parallel": "how experts are laid out over the mesh",
    "moe.ep_capacity_factor": "expert-parallel buffer size (drops are reported as a metric)",
    "moe.ep_dispatch_quant": "wire format of dispatched tokens; the expert weights and "
                             "the routing are the checkpoint's",
    "moe.ep_exchange": "how dispatched tokens travel between expert shards",
    "moe.bias_update_rate": "a training hyperparameter of the load balancer",
    "moe.aux_loss_coef": "a training loss weight",
    "moe.replay_filter_factor": "an RL router-replay setting",
}


def schema_keys(cfg: ml_collections.ConfigDict | None = None, prefix: str = "") -> list[str]:
  """Dotted leaf keys of the model schema, in order."""
  cfg = model_config.defaults() if cfg is None else cfg
  keys = []
  for key in cfg.keys():
    value = cfg[key]
    if isinstance(value, ml_collections.ConfigDict):
      keys += schema_keys(value, f"{prefix}{key}.")
    else:
      keys.append(prefix + key)
  return keys


def architecture_keys() -> list[str]:
  """The keys a phase inherits and may change only by declaring them."""
  return [key for key in schema_keys() if key not in FREE_KEYS]


def _get(cfg, dotted: str):
  node = cfg
  for part in dotted.split("."):
    node = node[part]
  return node


def _set(cfg, dotted: str, value) -> None:
  *parents, last = dotted.split(".")
  node = cfg
  for part in parents:
    node = node[part]
  node[last] = value


def _same(a, b) -> bool:
  if isinstance(a, bool) or isinstance(b, bool):
    return a is b
  if isinstance(a, (int, float)) and isinstance(b, (int, float)):
    return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
  if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  return a == b


def check_declared(changes: Iterable[str], key: str = "model_changes") -> tuple[str, ...]:
  """`config.model_changes` entries must be architecture keys of the model schema."""
  changes = tuple(changes)
  known = set(schema_keys())
  for change in changes:
    if change not in known:
      raise configlib.ConfigError(
          key, f"lists {change!r}, which is not a model config key; use dotted keys such "
          "as 'rope.factor' or 'num_mtp_layers' (c2jax/model/config.py).")
    if change in FREE_KEYS:
      raise configlib.ConfigError(
          key, f"lists {change!r}, which a phase may always change ({FREE_KEYS[change]}); "
          "drop it from the list.")
  return changes


def overrides(phase: ml_collections.ConfigDict) -> list[str]:
  """Architecture keys the phase set on purpose: values that differ from its variant's
  table (all of them when `phase.name` is not a variant)."""
  from c2jax.model import variants  # variants imports model.config; keep imports flat

  if phase.name not in variants.VARIANTS:
    return architecture_keys()
  table = variants.get(phase.name)
  return [key for key in architecture_keys() if not _same(_get(phase, key), _get(table, key))]


def differences(saved: ml_collections.ConfigDict, current: ml_collections.ConfigDict
                ) -> list[tuple[str, object, object]]:
  """(key, saved value, current value) for every architecture/numerics key on which two
  model configs disagree; implementation keys (FREE_KEYS) are ignored."""
  return [(key, _get(saved, key), _get(current, key)) for key in architecture_keys()
          if not _same(_get(saved, key), _get(current, key))]


def inherit(source: ml_collections.ConfigDict, phase: ml_collections.ConfigDict,
            declared: Iterable[str] = (), *, where: str = "the checkpoint"
            ) -> tuple[ml_collections.ConfigDict, list[str]]:
  """(the phase's model config, notes): `source` (the checkpoint's validated model) with
  the phase's free keys and declared changes; `notes` list what was changed or inherited.

  Raises ConfigError naming the key and both values for an undeclared override that
  disagrees with `source`.
  """
  declared = check_declared(declared)
  resolved = source.copy_and_resolve_references()
  notes, inherited = [], []
  for key in FREE_KEYS:
    _set(resolved, key, _get(phase, key))
  stated = set(overrides(phase))
  for key in architecture_keys():
    mine, theirs = _get(phase, key), _get(source, key)
    if _same(mine, theirs):
      continue
    if key in declared:
      _set(resolved, key, mine)
      notes.append(f"model.{key}: {theirs!r} -> {mine!r} (declared in config.model_changes)")
    elif key in stated:
      raise configlib.ConfigError(
          f"model.{key}",
          f"is {mine!r} in this config but {theirs!r} in {where} (config.init_from). A phase "
          f"inherits its model config from the checkpoint it starts from, and "
          f"{key} changes the architecture or numerics. Drop the override to keep "
          f"{theirs!r}, or, if the change is intended, add {key!r} to config.model_changes.")
    else:
      inherited.append(f"{key}={theirs!r}")
  if inherited:
    notes.append(f"inherited from {where} where it differs from the {phase.name!r} "
                 f"variant: {', '.join(inherited)}")
  return model_config.validate(resolved), notes
