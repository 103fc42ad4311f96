"""The model config a phase runs: inherited from what `init_from` points at.

    cfg = model_source.resolve(cfg)   # before anything is built or compiled

`init_from` may name a c2jax run (its newest checkpoint carries the resolved job config
it trained with), an HF model directory (config.json, read by c2jax.hf.config) or a
`c2jax convert` output (c2jax_model.json). The phase's own model section is merged into
the source's by c2jax.model.lineage: implementation keys are the phase's, declared changes
(`config.model_changes`) apply, any other disagreement is an error naming the key and both
values. A checkpoint that records no model config (written by code older than this) leaves
the phase's model as given; the parameter shapes are still checked on restore.

Resuming a workdir (`check_resume`) compares the same way, against the model its newest
checkpoint trained: a changed architecture or numerics key is an error naming the key and
both values, raised before anything is built, compiled or restored; a changed
implementation key (remat, moe_impl, attention_impl, ...) resumes.
"""

from __future__ import annotations

import ml_collections
import orbax.checkpoint as ocp

from c2jax import config as configlib
from c2jax import storage
from c2jax.hf import sources
from c2jax.model import config as model_config
from c2jax.model import lineage


def _run_model(directory) -> dict | None:
  """The `model` section of the job config saved with the newest checkpoint step."""
  manager = ocp.CheckpointManager(
      directory, item_names=("config",),
      options=ocp.CheckpointManagerOptions(create=False, read_only=True))
  try:
    steps = sorted(manager.all_steps())
    if not steps:
      return None
    saved = manager.restore(steps[-1], args=ocp.args.Composite(config=ocp.args.JsonRestore()))
  finally:
    manager.close()
  job = saved["config"] or {}
  if "model" not in job and isinstance(job.get("config"), dict):
    job = job["config"]  # the RL learner nests its job config one level down
  return job.get("model") or None


def check_resume(cfg, checkpoints) -> None:
  """Raises ConfigError if `cfg.model` differs from the model the newest checkpoint under
  `checkpoints` (a run's checkpoint directory) was trained with in an architecture or
  numerics key; reads only that step's saved config. Nothing to resume, a checkpoint
  without a saved model config, or one whose config cannot be read (restore decides what
  to do with a damaged step) passes."""
  path = storage.orbax_path(checkpoints)
  if not path.is_dir() or not any(child.name.isdigit() for child in path.iterdir()):
    return
  try:
    values = _run_model(path)
  except Exception:  # pylint: disable=broad-except  (damage is the restore's to judge)
    return
  if not values:
    return
  where = f"the checkpoint this run resumes ({path})"
  changed = lineage.differences(_from_dict(values, where), cfg.model)
  if not changed:
    return
  key, saved, mine = changed[0]
  others = "".join(f"; model.{k} is {m!r} here, {s!r} there" for k, s, m in changed[1:])
  raise configlib.ConfigError(
      f"model.{key}",
      f"is {mine!r} in this config but {saved!r} in {where}{others}. A resumed run keeps "
      "the model it was trained with, and this key changes the architecture or numerics. "
      "Drop the override to resume; to train a changed model from these weights, use a "
      "new workdir with --config.init_from=<this workdir> and list the key in "
      "config.model_changes. No checkpoint was read or changed.")


def _from_dict(values: dict, where: str) -> ml_collections.ConfigDict:
  """A saved model section as a validated config; keys added to the schema since it was
  saved take their defaults, keys since removed are an error naming them."""
  cfg = model_config.defaults()
  try:
    configlib.apply_overrides(cfg, values)
  except configlib.ConfigError as err:
    raise configlib.ConfigError(
        "init_from", f"the model config saved in {where} does not fit this version of "
        f"c2jax ({err}); convert the checkpoint or start from scratch.") from None
  return model_config.validate(cfg)


def source_model(init_from: str) -> tuple[ml_collections.ConfigDict | None, str]:
  """(model config, description) of what `init_from` points at; None when the source
  records no model config (an older c2jax checkpoint)."""
  try:
    source = sources.locate(init_from)
    if source.kind != "run":
      where = (f"the HF model {source.path}" if source.kind == "hf" else
               f"the converted checkpoint {source.path}")
      return sources.model_config(source.path), where
  except sources.SourceError as err:
    raise configlib.ConfigError("init_from", str(err)) from None
  where = f"the run {source.steps_dir}"
  values = _run_model(source.steps_dir)
  return (_from_dict(values, where) if values else None), where


def resolve_model(phase_model, declared, init_from: str,
                  source=None) -> tuple[ml_collections.ConfigDict, list[str]]:
  """(the model config the phase runs, notes). `source` (a model config) stands in for
  reading init_from, e.g. when a pipeline checks its chain before the first stage runs."""
  lineage.check_declared(declared)
  if not init_from:
    return phase_model, []
  where = f"the previous stage ({init_from})"
  if source is None:
    source, where = source_model(init_from)
  if source is None:
    return phase_model, [f"{where} records no model config; config.model is used as given"]
  return lineage.inherit(source, phase_model, declared, where=where)


def resolve(cfg, source=None, *, log: bool = True):
  """A copy of the job config `cfg` whose model is the one its init_from trained."""
  cfg = cfg.copy_and_resolve_references()
  resolved, notes = resolve_model(cfg.model, cfg.model_changes, cfg.init_from, source)
  if log:
    for note in notes:
      print(f"init: {note}", flush=True)
  with cfg.ignore_type():
    cfg.model = resolved
  return cfg


def check_chain(stages) -> list:
  """The resolved job configs of a chain of (name, job config) stages, each starting from
  the one before it; the first resolves from its own init_from (if any). Raises
  ConfigError keyed `<stage>.model.<key>` for an undeclared architecture change, before
  any stage has run (each resolves again from its real checkpoint when it starts)."""
  resolved, source = [], None
  for index, (name, stage_cfg) in enumerate(stages):
    try:
      if index == 0:
        out = resolve(stage_cfg, log=False) if stage_cfg.init_from else stage_cfg
      else:
        out = resolve(stage_cfg, source=source, log=False)
    except configlib.ConfigError as err:
      message = str(err).split(": ", 1)[1]
      raise configlib.ConfigError(f"{name}.{err.key}", message) from None
    resolved.append(out)
    source = out.model
  return resolved
