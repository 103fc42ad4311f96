"""Parameters a run starts from when it does not resume: those of `config.init_from`.

    state = init_params.initial_params(rt, runtime.init_state(rt))   # a job's first step
    params = init_params.restore_init_params(cfg, fresh_params)       # serve, eval, tools

Every later phase (long context, SFT, RL) and every reader of a finished run (serve, eval,
export tools) restores through here, so a checkpoint of a c2jax run, an HF model
directory and `c2jax convert` output are told apart, checked and placed the same way.
"""

from __future__ import annotations

import jax
import orbax.checkpoint as ocp

from c2jax import storage
from c2jax.hf import placement
from c2jax.hf import sources as init_sources
from c2jax.model import mtp as mtp_lib
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train.step import TrainState


def _dict_keys(path) -> tuple:
  return tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))


def initial_params(rt, state: TrainState) -> TrainState:
  """A fresh run of a later phase starts from the previous phase's newest parameters
  (`restore_init_params`, placed with the runtime's shardings)."""
  if not rt.cfg.init_from:
    return state
  shardings = rt.state_shardings.params
  with rt.scope():
    params = restore_init_params(rt.cfg, state.params, shardings)
  return state.replace(params=params)


def restore_init_params(cfg, fresh_params, shardings=None):
  """`fresh_params` replaced by the parameters of `cfg.init_from`: the newest checkpoint
  of a c2jax run, an HF model directory or `c2jax convert` output (hf/sources.py tells
  them apart by what is on disk; the latter two stream shard by shard, hf/placement.py).

  Multi-token prediction may be attached or left off between phases:
  - the config has MTP modules (model.num_mtp_layers > 0) and the checkpoint has none:
    the trunk is restored and params['mtp_layers'] keep their fresh initialisation (how
    MTP starts from a checkpoint cut mid-way through pretraining);
  - the checkpoint has MTP modules and the config has none: they are deliberately
    dropped (a phase that needs no drafter, e.g. an ablation without MTP), with a log line.
  Any other difference (a parameter missing, a shape changed, e.g. num_mtp_layers 2 vs
  1) is an error naming the parameter. `shardings` (a tree like `fresh_params`) places
  the restored arrays; None restores them to the default device.
  """
  source = cfg.init_from
  # A local path, or for a run any URL c2jax.storage accepts (gs://, s3://, file://).
  directory = storage.orbax_path(source, "config.init_from")
  if not directory.exists():
    raise FileNotFoundError(
        f"config.init_from = {source!r} does not exist; run the previous phase first "
        "(see configs/longctx.py and configs/sft.py for the chain), or point it at an HF "
        "model directory.")
  located = init_sources.locate(source)
  if located.kind == "run":
    saved, where, restore = _orbax_source(located.steps_dir, source)
  else:
    loaded = init_sources.open_source(source)
    saved, where = _nested(loaded.shapes), f"{directory} ({loaded.kind})"

    def restore(abstract, placement_shardings):
      return placement.place(loaded, abstract, placement_shardings)
  fresh_mtp = mtp_lib.PARAMS_KEY in fresh_params and mtp_lib.PARAMS_KEY not in saved
  wanted = {k: v for k, v in fresh_params.items()
            if not (fresh_mtp and k == mtp_lib.PARAMS_KEY)}
  _check_restorable(saved, wanted, where)
  if shardings is not None:
    shardings = {k: v for k, v in shardings.items() if k in wanted}
  params = restore(checkpoint_lib.abstract_like(wanted), shardings)
  print(f"init: parameters from {where}", flush=True)
  if fresh_mtp:
    params = {**params, mtp_lib.PARAMS_KEY: fresh_params[mtp_lib.PARAMS_KEY]}
    print(f"init: the checkpoint has no '{mtp_lib.PARAMS_KEY}'; the "
          f"{cfg.model.num_mtp_layers} MTP module(s) start from a fresh initialisation "
          "(trunk, embedding and head restored)", flush=True)
  elif mtp_lib.PARAMS_KEY in saved and mtp_lib.PARAMS_KEY not in fresh_params:
    print(f"init: dropping the checkpoint's '{mtp_lib.PARAMS_KEY}' "
          "(config.model.num_mtp_layers = 0)", flush=True)
  return params


def _orbax_source(directory, source: str):
  """(saved shapes, description, restore(abstract, shardings)) of a c2jax run whose
  checkpoint steps are in `directory`."""
  previous = checkpoint_lib.Checkpointer(directory, async_save=False)
  if not previous.steps():
    previous.close()
    raise FileNotFoundError(
        f"config.init_from = {source!r} has no checkpoints; run the previous phase first "
        "(see configs/longctx.py and configs/sft.py for the chain).")
  step = previous.steps()[-1]

  def restore(abstract, shardings):
    if shardings is not None:
      abstract = checkpoint_lib.abstract_like(abstract, shardings)
    try:
      return previous.restore_params(step, abstract)
    finally:
      previous.close()
  return _saved_param_shapes(directory, step), f"{directory} step {step}", restore


def _nested(shapes: dict) -> dict:
  tree: dict = {}
  for path, shape in shapes.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = tuple(shape)
  return tree


def _saved_param_shapes(directory, step: int) -> dict:
  """The saved parameter tree of a checkpoint step, as shapes, read from orbax metadata
  (no array is loaded)."""
  handler = ocp.PyTreeCheckpointHandler()
  try:
    tree = handler.metadata(directory / str(step) / "state").tree
  finally:
    handler.close()
  return jax.tree.map(lambda m: tuple(m.shape), tree["params"],
                      is_leaf=lambda m: hasattr(m, "shape"))


def _check_restorable(saved: dict, wanted: dict, where: str) -> None:
  saved_shapes = {_dict_keys(path): shape for path, shape in
                  jax.tree_util.tree_leaves_with_path(saved, is_leaf=_is_shape)}
  for path, leaf in jax.tree_util.tree_leaves_with_path(wanted):
    keys = _dict_keys(path)
    name = "/".join(keys)
    if keys not in saved_shapes:
      raise ValueError(
          f"config.init_from: parameter {name} is not in the checkpoint {where}; the "
          "previous phase trained a different model. Make config.model match it.")
    if saved_shapes[keys] != tuple(leaf.shape):
      hint = (" (config.model.num_mtp_layers differs from the checkpoint's)"
              if keys[0] == mtp_lib.PARAMS_KEY else "")
      raise ValueError(
          f"config.init_from: parameter {name} has shape {saved_shapes[keys]} in the "
          f"checkpoint {where} but {tuple(leaf.shape)} in this config{hint}; make "
          "config.model match the previous phase.")


def _is_shape(x) -> bool:
  return isinstance(x, tuple) and all(isinstance(d, int) for d in x)
