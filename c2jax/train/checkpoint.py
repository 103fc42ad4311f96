"""orbax checkpoints of a whole run: TrainState, data iterator state and resolved config.

Checkpoints are written asynchronously; orbax commits a step atomically (a killed write
leaves only a temporary directory, which is ignored). A step whose files are damaged fails
to restore: the manager reports it and falls back to the previous step.
"""

from __future__ import annotations

import logging
import pathlib

import jax
import orbax.checkpoint as ocp


class Checkpointer:

  def __init__(self, directory: str | pathlib.Path, *, keep: int = 3, every: int = 100,
               async_save: bool = True):
    self.directory = pathlib.Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, save_interval_steps=every, enable_async_checkpointing=async_save,
        create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=("state", "data", "config"))

  def save(self, step: int, state, data_state: dict, config: dict, *,
           force: bool = False) -> bool:
    return self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                data=ocp.args.JsonSave(data_state),
                                config=ocp.args.JsonSave(config)),
        force=force)

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def restore_latest(self, abstract_state):
    """(step, state, data_state) of the newest readable checkpoint, or None.

    `abstract_state` is a pytree of jax.ShapeDtypeStruct (with shardings) telling orbax
    where to place each restored array.
    """
    for step in reversed(self.steps()):
      try:
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                          data=ocp.args.JsonRestore()))
      except Exception as err:  # damaged files surface as many different error types
        logging.warning("checkpoint step %d in %s cannot be restored (%s: %s); "
                        "falling back to the previous checkpoint", step, self.directory,
                        type(err).__name__, str(err).splitlines()[0][:200])
        kept = self._set_aside(step)
        print(f"checkpoint: step {step} is corrupt or partial ({type(err).__name__}); "
              f"moved to {kept.name} and using the previous checkpoint", flush=True)
        continue
      return step, restored["state"], restored["data"]
    return None

  def _set_aside(self, step: int) -> pathlib.Path:
    """Renames an unreadable step out of orbax's way (kept for inspection, not deleted)."""
    source = self.directory / str(step)
    target = self.directory / f"{step}.corrupt"
    suffix = 0
    while target.exists():
      suffix += 1
      target = self.directory / f"{step}.corrupt{suffix}"
    source.rename(target)
    self._manager.reload()
    return target

  def restore_params(self, step: int | None, abstract_params):
    """Only the parameters of a checkpoint (to initialise a later phase)."""
    step = self.steps()[-1] if step is None else step
    abstract = {"params": abstract_params}
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item=abstract, partial_restore=True,
            restore_args=ocp.checkpoint_utils.construct_restore_args(abstract))))
    return restored["state"]["params"]

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def abstract_like(tree, shardings=None):
  """ShapeDtypeStructs of `tree` (optionally with shardings) for restore targets."""
  if shardings is None:
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
  return jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
