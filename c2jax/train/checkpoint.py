"""orbax checkpoints of a whole run: TrainState, data iterator state and resolved config.

Checkpoints are written asynchronously; orbax commits a step atomically (a killed write
leaves only a temporary directory, which is ignored).

Restore never destroys a run. When the newest step fails to restore, the cause decides:
  damaged files (truncated or missing array files, unreadable metadata): the step is
      renamed to `<step>.corrupt` (kept for inspection) and the previous step is tried;
  a mismatch between the checkpoint and the state asked for (a changed config: other
      shapes or parameter tree), a missing dependency (ImportError), an I/O error
      (permission, a storage service that is down), or any cause not recognised as
      damage: `CheckpointRestoreError` naming the cause, with every step left in place.

With several jax.distributed processes each process has its own data-iterator state;
`save` gathers them and the checkpoint keeps every process's. Restoring returns them all,
in the writing run's process order, whatever this run's process count: the job decides
what each of its processes continues from (training data streams: c2jax.data.streams;
the RL leader's queue position: the writer's process 0). The state arrays are restored
into this run's shardings, so a run resumes on another mesh and process count.
"""

from __future__ import annotations

import errno
import json
import logging
import pathlib

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from c2jax import storage


class CheckpointRestoreError(RuntimeError):
  """A checkpoint exists but cannot be restored for a reason other than damaged files;
  nothing was moved."""


# OSErrors that say the files are absent or malformed (damage), not that storage failed.
_DAMAGE_ERRNOS = frozenset({errno.ENOENT, errno.EISDIR, errno.ENOTDIR})
# tensorstore / gRPC status codes in messages: storage unreachable or forbidden.
_IO_STATUSES = ("PERMISSION_DENIED", "UNAUTHENTICATED", "UNAVAILABLE", "DEADLINE_EXCEEDED",
                "RESOURCE_EXHAUSTED", "ABORTED")
# ... and the ones (and orbax / json phrases) that say stored bytes are missing or bad.
_DAMAGE_MARKERS = ("OUT_OF_RANGE", "DATA_LOSS", "NOT_FOUND", "is not valid for value of size",
                   "does not exist", "Error decoding", "Error reading", "corrupt", "truncated",
                   "Unexpected end", "Expecting value", "Expecting property name")


def _chain(err: BaseException) -> list[BaseException]:
  """err and its causes / contexts (orbax and tensorstore wrap the original error)."""
  seen = []
  while err is not None and err not in seen:
    seen.append(err)
    err = err.__cause__ or err.__context__
  return seen


def _describe(err: BaseException) -> str:
  return f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"


def _key_name(entry) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def _leaf_shapes(tree) -> dict[str, tuple]:
  """{'a/b/0': shape} for every array leaf; paths spelled alike for a live pytree and
  orbax's stored metadata tree (which turns attributes and indices into dict keys)."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(_key_name(e) for e in path): tuple(leaf.shape) for path, leaf in flat
          if hasattr(leaf, "shape")}


class Checkpointer:

  def __init__(self, directory: str | pathlib.Path, *, keep: int = 3, every: int = 100,
               async_save: bool = True):
    # A local path or an object-store URL (gs://, s3://, file://): c2jax.storage.
    self.directory = storage.orbax_path(directory)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, save_interval_steps=every, enable_async_checkpointing=async_save,
        create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=("state", "data", "config"))

  def save(self, step: int, state, data_state: dict, config: dict, *,
           force: bool = False) -> bool:
    if jax.process_count() > 1:  # a collective: every process saves the same step
      data_state = {_PER_PROCESS: _gather_json(data_state)}
    return self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                data=ocp.args.JsonSave(data_state),
                                config=ocp.args.JsonSave(config)),
        force=force)

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def restore_latest(self, abstract_state):
    """(step, state, data_states) of the newest restorable checkpoint, or None if none.

    `abstract_state` is a pytree of jax.ShapeDtypeStruct (with shardings) telling orbax
    where to place each restored array (this run's mesh, which may differ from the
    writer's). data_states is the list of each writing process's data state, in process
    order. Damaged steps are set aside and older ones tried; any other failure raises
    CheckpointRestoreError and moves nothing (module docstring).
    """
    for step in reversed(self.steps()):
      try:
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                          data=ocp.args.JsonRestore()))
      except Exception as err:  # pylint: disable=broad-except  (classified below)
        damage = self._damage(step, err, abstract_state)
        logging.warning("checkpoint step %d in %s is damaged (%s); falling back to the "
                        "previous checkpoint", step, self.directory, damage)
        kept = self._set_aside(step)
        print(f"checkpoint: step {step} is corrupt or partial ({damage}); moved to "
              f"{kept.name} and using the previous checkpoint", flush=True)
        continue
      return step, restored["state"], _per_process(restored["data"])
    return None

  def data_states(self) -> list[dict] | None:
    """The writing processes' data states of the newest step whose data slot reads (no
    arrays are read), or None without one: what a resume needs to know before it builds
    anything (how the run's data was split)."""
    for step in reversed(self.steps()):
      try:
        restored = self._manager.restore(
            step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))
      except Exception:  # pylint: disable=broad-except  (restore_latest classifies it)
        continue
      return _per_process(restored["data"])
    return None

  def _stored_shapes(self, step: int) -> dict[str, tuple]:
    """The shapes step's state was saved with, from its metadata alone (no arrays read)."""
    metadata = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "state")
    return _leaf_shapes(getattr(metadata, "tree", metadata))

  def _damage(self, step: int, err: Exception, abstract_state) -> str:
    """Why step's restore failed, when its files are damaged; raises
    CheckpointRestoreError for every other cause (nothing is moved then)."""
    where = f"checkpoint step {step} in {self.directory}"
    untouched = "Every checkpoint was left in place."
    chain = _chain(err)
    text = " | ".join(str(e) for e in chain)
    missing = [e for e in chain if isinstance(e, ImportError)]
    if missing:
      raise CheckpointRestoreError(
          f"Cannot restore {where}: a dependency is missing ({_describe(missing[0])}). "
          f"Install it (see setup.py) and rerun. {untouched}") from err
    io = [e for e in chain if isinstance(e, OSError) and e.errno not in _DAMAGE_ERRNOS
          and not isinstance(e, FileNotFoundError)]
    if io or any(status in text for status in _IO_STATUSES):
      cause = _describe(io[0]) if io else _describe(err)
      raise CheckpointRestoreError(
          f"Cannot read {where}: I/O error ({cause}). Check the storage (permissions, "
          f"mounts, credentials, service status) and rerun. {untouched}") from err
    try:
      stored = self._stored_shapes(step)
    except Exception as meta_err:  # pylint: disable=broad-except
      if isinstance(meta_err, ImportError) or (
          isinstance(meta_err, OSError) and meta_err.errno not in _DAMAGE_ERRNOS):
        raise CheckpointRestoreError(
            f"Cannot read the metadata of {where} ({_describe(meta_err)}). {untouched}"
        ) from meta_err
      return f"unreadable metadata: {_describe(meta_err)}"
    mismatch = _mismatch(stored, _leaf_shapes(abstract_state))
    if mismatch:
      raise CheckpointRestoreError(
          f"{where} does not match the state this run builds: {mismatch}. The config "
          "changed since it was written (model size, optimizer, ...): rerun with the "
          f"config that wrote it (saved in the run directory), or use a new workdir. "
          f"{untouched}") from err
    if any(isinstance(e, (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError,
                          EOFError)) for e in chain) or any(m in text for m in _DAMAGE_MARKERS):
      return _describe(err)
    raise CheckpointRestoreError(
        f"Cannot restore {where} ({_describe(err)}); its files look intact and match this "
        f"run's state, so it was not set aside. {untouched}") from err

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


_PER_PROCESS = "per_process"  # the data slot of a multi-process checkpoint


def _per_process(data_state) -> list[dict]:
  """Each writing process's data state: a multi-process checkpoint keeps the list, one
  written by a single process its state alone."""
  if isinstance(data_state, dict) and _PER_PROCESS in data_state:
    return list(data_state[_PER_PROCESS])
  return [data_state or {}]


def _gather_json(value) -> list:
  """Every process's JSON-serialisable `value`, in process order, on every process."""
  encoded = np.frombuffer(json.dumps(value).encode(), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.int32(encoded.size))).reshape(-1)
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:encoded.size] = encoded
  gathered = np.asarray(multihost_utils.process_allgather(padded))
  return [json.loads(row[:size].tobytes()) for row, size in zip(gathered, sizes)]


def _mismatch(stored: dict[str, tuple], wanted: dict[str, tuple], limit: int = 4) -> str:
  """'' when the trees and shapes agree, else the first differences in words."""
  problems = [f"{k} is missing from the checkpoint" for k in wanted if k not in stored]
  problems += [f"{k} is in the checkpoint but not in this run" for k in stored
               if k not in wanted]
  problems += [f"{k} has shape {stored[k]} in the checkpoint, {wanted[k]} in this run"
               for k in wanted if k in stored and stored[k] != wanted[k]]
  more = f" (and {len(problems) - limit} more)" if len(problems) > limit else ""
  return "; ".join(problems[:limit]) + more


def abstract_like(tree, shardings=None):
  """ShapeDtypeStructs of `tree` (optionally with shardings) for restore targets."""
  if shardings is None:
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
  return jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
